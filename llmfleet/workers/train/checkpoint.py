"""Sharded checkpoints with torch.distributed.checkpoint (DCP).

Layout: <uri>/step-00000100/ holds the DCP shards of model + optimizer (any world size can load them: DCP
reshards), trainer.pt (rank 0: step, scheduler, samples seen) and rng-rank<r>.pt (each rank's RNG).
A checkpoint is complete once DCP's .metadata exists (DCP writes it last), so a crash mid-save leaves an
incomplete folder that resume skips.
"""

from __future__ import annotations

import re
import shutil
from concurrent.futures import Future
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

STEP_DIR = re.compile(r"^step-(\d{8})$")


class ModelOptimState(Stateful):
    """Model + optimizer through get/set_state_dict, which turn FSDP2 DTensors into resharding-aware keys."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optim"])


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def complete_checkpoints(root: str | Path) -> list[Path]:
    base = Path(root)
    if not base.is_dir():
        return []
    found = [p for p in base.iterdir() if STEP_DIR.match(p.name) and (p / ".metadata").is_file()
             and (p / "trainer.pt").is_file()]
    return sorted(found)


class Checkpointer:
    def __init__(self, root: str | Path, keep: int, async_save: bool, rank: int) -> None:
        self.root, self.keep, self.rank = Path(root), keep, rank
        self.async_save = async_save and hasattr(dcp, "async_save") and torch.cuda.is_available()
        self.pending: Future[Any] | None = None
        self.last: str | None = None

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, trainer_state: dict[str, Any]) -> None:
        self.wait()
        path = self.root / f"step-{step:08d}"
        if self.rank == 0:
            path.mkdir(parents=True, exist_ok=True)
            torch.save(trainer_state, path / "trainer.pt")
        dist.barrier()
        torch.save(_rng_state(), path / f"rng-rank{self.rank}.pt")
        state = {"app": ModelOptimState(model, optimizer)}
        if self.async_save:
            self.pending = cast("Future[Any]", dcp.async_save(state, checkpoint_id=str(path)))  # type: ignore[attr-defined]
        else:
            dcp.save(state, checkpoint_id=str(path))  # type: ignore[attr-defined]
        self.last = str(path)
        if not self.async_save:
            self._prune()

    def wait(self) -> None:
        if self.pending is not None:
            self.pending.result()
            self.pending = None
            self._prune()

    def _prune(self) -> None:
        if self.rank != 0:
            return
        done = complete_checkpoints(self.root)
        for old in done[: max(0, len(done) - self.keep)]:
            shutil.rmtree(old, ignore_errors=True)

    def load_latest(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """Load the newest complete checkpoint into model/optimizer; returns its trainer state or None."""
        done = complete_checkpoints(self.root)
        if not done:
            return None
        path = done[-1]
        dcp.load({"app": ModelOptimState(model, optimizer)}, checkpoint_id=str(path))  # type: ignore[attr-defined]
        trainer_state: dict[str, Any] = torch.load(path / "trainer.pt", weights_only=False)
        rng = path / f"rng-rank{self.rank}.pt"
        if rng.is_file() and trainer_state.get("world_size") == dist.get_world_size():
            state = torch.load(rng, weights_only=False)
            torch.random.set_rng_state(state["cpu"])
            if "cuda" in state and torch.cuda.is_available():
                torch.cuda.set_rng_state(state["cuda"])
        self.last = str(path)
        return trainer_state
