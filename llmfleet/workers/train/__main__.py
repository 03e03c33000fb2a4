"""Entry point: `torchrun ... -m llmfleet.workers.train --spec job.yaml` (one process per GPU, or one CPU
process with gloo). The spec is a TrainingJob manifest or just its spec."""

from __future__ import annotations

import argparse
import logging
import sys

from llmfleet.api.trainingjob import TrainingJobSpec


def load_spec(path: str) -> TrainingJobSpec:
    from llmfleet.api.loader import load_manifest, load_yaml_file
    from llmfleet.api.trainingjob import TrainingJob

    doc = load_yaml_file(path)
    if isinstance(doc, dict) and doc.get("kind") == "TrainingJob":
        job = load_manifest(path)
        if not isinstance(job, TrainingJob):
            raise ValueError(f"{path}: expected a TrainingJob")
        return job.spec
    from pydantic import ValidationError

    from llmfleet.api.loader import ManifestError, problems_from

    try:
        return TrainingJobSpec.model_validate(doc.get("spec", doc) if isinstance(doc, dict) else doc)
    except ValidationError as err:
        raise ManifestError(path, problems_from(err)) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmfleet.workers.train")
    parser.add_argument("--spec", required=True, help="TrainingJob manifest or spec (YAML)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from pydantic import ValidationError

    try:
        spec = load_spec(args.spec)
    except (OSError, ValueError, ValidationError) as err:
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    from llmfleet.workers.train.trainer import Trainer

    try:
        trainer = Trainer(spec)
    except (OSError, ValueError) as err:  # bad data path, vocab mismatch, batch not divisible, port in use
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    done = False
    try:
        trainer.resume()
        trainer.train()
        trainer.export()
        done = True
    finally:
        trainer.close(done)
    return 0


if __name__ == "__main__":
    sys.exit(main())
