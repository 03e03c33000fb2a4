"""The InferenceService manifest as `llmfleet up` runs it: loaded, tiny:// model paths resolved, checked.

Used at start (`llmfleet up -f`) and by the running supervisor when that file is edited.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmfleet.api import InferenceService

TINY_SCHEME = "tiny://"


class InvalidManifest(ValueError):
    """A manifest `llmfleet up` cannot run; the message names the file and the field."""


def load_service(file: Path) -> InferenceService:
    """The InferenceService of `file`, ready to run here: tiny:// paths resolved, engine arguments and local
    model/adapter folders checked. Raises InvalidManifest (also what the running supervisor uses on an edit)."""
    from llmfleet.api import InferenceService, ManifestError, load_manifest
    from llmfleet.workers.serve.vllm_args import InvalidServeSpec, render_vllm_args, validate_adapter_files

    try:
        res = load_manifest(file)
    except ManifestError as err:
        raise InvalidManifest(str(err)) from None
    if not isinstance(res, InferenceService):
        raise InvalidManifest(f"{file} is a {res.kind}; `llmfleet up` runs an InferenceService "
                              "(use `llmfleet train` for a TrainingJob)")
    isvc = resolve_tiny_paths(res)
    try:
        for pool in isvc.pools():
            render_vllm_args(isvc, pool)
        validate_adapter_files(isvc)
    except InvalidServeSpec as err:
        raise InvalidManifest(f"{file}: {err}") from None
    for pool in isvc.pools():
        local = pool.model.path.removeprefix("file://")
        # A missing local folder would only show as replicas crash-looping in the background.
        if local.startswith(("/", "./", "../", "~")) and not Path(local).expanduser().exists():
            raise InvalidManifest(f"{file}: model path {pool.model.path!r} of pool {pool.name} does not exist")
    return isvc


def resolve_tiny_paths(isvc: InferenceService) -> InferenceService:
    """Replace `tiny://<name>` model paths by the built tiny model folders (building them on first use)."""
    from llmfleet.api import InferenceService
    from llmfleet.local.tinymodel import SPECS, build_tiny

    data = isvc.model_dump(by_alias=True, exclude_none=True, mode="json")
    models = [data["spec"]["model"]] + [p["model"] for p in data["spec"].get("fallback", {}).get("pools", [])]
    for m in models:
        if m["path"].startswith(TINY_SCHEME):
            name = m["path"][len(TINY_SCHEME):]
            if name not in SPECS:
                raise InvalidManifest(f"unknown tiny model {m['path']!r}; known: "
                                      f"{', '.join(TINY_SCHEME + n for n in SPECS)}")
            m["path"] = str(build_tiny(SPECS[name]))
    return InferenceService.model_validate(data)
