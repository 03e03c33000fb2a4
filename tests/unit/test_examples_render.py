"""Every example InferenceService pool renders to engine arguments (no example the operator would reject)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfleet.api import InferenceService, load_file
from llmfleet.workers.serve.vllm_args import render_vllm_args

ROOT = Path(__file__).resolve().parents[2]
SERVICES = [
    (p.relative_to(ROOT).as_posix(), r)
    for p in sorted([*ROOT.glob("examples/*.yaml"), *ROOT.glob("examples/local/*.yaml")])
    for r in load_file(p)
    if isinstance(r, InferenceService)
]


@pytest.mark.parametrize(("name", "isvc"), SERVICES, ids=[n for n, _ in SERVICES])
def test_every_pool_of_every_example_renders(name: str, isvc: InferenceService) -> None:
    for pool in isvc.pools():
        argv = render_vllm_args(isvc, pool, port=8000)
        assert "--model" in argv and "--served-model-name" in argv
        assert argv[argv.index("--block-size") + 1] == str(pool.block_size)
