"""The InferenceService manifest as `llmfleet up` runs it: loaded, model locations made local folders, checked.

Used at start (`llmfleet up -f`) and by the running supervisor when that file is edited.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmfleet.api import InferenceService



class InvalidManifest(ValueError):
    """A manifest `llmfleet up` cannot run; the message names the file and the field."""


def load_service(file: Path) -> InferenceService:
    """The InferenceService of `file`, ready to run here: model locations resolved to local folders, engine
    arguments and model/adapter folders checked. Raises InvalidManifest (also what the running supervisor uses
    on an edit)."""
    from llmfleet.api import InferenceService, ManifestError, load_manifest
    from llmfleet.api.loader import problems_line
    from llmfleet.plan.pool_presets import model_preset_problems
    from llmfleet.workers.serve.vllm_args import InvalidServeSpec, render_vllm_args, validate_adapter_files

    try:
        res = load_manifest(file)
    except ManifestError as err:
        raise InvalidManifest(str(err)) from None
    if not isinstance(res, InferenceService):
        raise InvalidManifest(f"{file} is a {res.kind}; `llmfleet up` runs an InferenceService "
                              "(use `llmfleet train` for a TrainingJob)")
    if problems := model_preset_problems(res):
        raise InvalidManifest(f"{file}: {problems_line(problems)}")
    isvc = resolve_model_paths(res)
    try:
        for pool in isvc.pools():
            render_vllm_args(isvc, pool)
        validate_adapter_files(isvc)
    except InvalidServeSpec as err:
        raise InvalidManifest(f"{file}: {err}") from None
    for pool in isvc.pools():
        # A missing local folder would only show as replicas crash-looping in the background.
        if not Path(pool.model.path).expanduser().exists():
            raise InvalidManifest(f"{file}: model path {pool.model.path!r} of pool {pool.name} does not exist")
    return isvc


def resolve_model_paths(isvc: InferenceService) -> InferenceService:
    """Every pool's model as a local folder: tiny:// built (first use), s3:// and hf:// fetched into the cache
    ($LLMFLEET_CACHE/fetched; resumable and checked, a second `up` finds them complete), file:// stripped.
    pvc:// exists only on Kubernetes."""
    import logging

    from llmfleet.api import InferenceService
    from llmfleet.api.contracts import MODEL_PRESET_ANNOTATION
    from llmfleet.api.storage import parse_uri
    from llmfleet.local.tinymodel import tiny_path
    from llmfleet.plan.pool_presets import pool_preset
    from llmfleet.storage import FetchError, local_copy

    progress = logging.getLogger("llmfleet.storage")
    if not progress.handlers:  # the fetch's progress lines on stderr while `up` waits for it
        progress.addHandler(logging.StreamHandler())
        progress.setLevel(logging.INFO)
    data = isvc.model_dump(by_alias=True, exclude_none=True, mode="json")
    # a preset known from an hf:// repository, kept as an annotation: the local folder below no longer names it
    for view in isvc.pools():
        if isvc.model_preset(view) is None and (preset := pool_preset(isvc, view)):
            data["metadata"].setdefault("annotations", {})[f"{MODEL_PRESET_ANNOTATION}.{view.name}"] = preset
    models = [data["spec"]["model"]] + [p["model"] for p in data["spec"].get("fallback", {}).get("pools", [])]
    for m in models:
        uri = parse_uri(m["path"])
        if uri.scheme == "tiny":
            try:
                m["path"] = tiny_path(m["path"])
            except ValueError as err:
                raise InvalidManifest(str(err)) from None
        elif uri.scheme == "pvc":
            raise InvalidManifest(f"model {m['path']!r}: pvc:// claims exist only on Kubernetes; give the claim's "
                                  "local folder here")
        else:
            try:
                m["path"] = str(local_copy(uri))
            except FetchError as err:
                raise InvalidManifest(f"model {m['path']!r}: {err}") from None
    return InferenceService.model_validate(data)
