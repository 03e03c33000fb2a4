"""The torchtitan case of benchmarks/train_mfu.py: torchtitan's own Trainer (its llama3 model, parallelize_llama
with torch.compile / float8 / FSDP2, its AdamW, loss, gradient clipping and metrics) on the llmfleet reference
shape. Loaded through torchtitan's `--experimental.custom_import`; it registers one train spec,
`llmfleet_llama3`, which is torchtitan's llama3 spec with two things replaced so that nothing is downloaded:

- the model flavour `ref`: the shape in LLMFLEET_TT_SHAPE (JSON of the benchmark's CONFIGS entry);
- the data: llmfleet's token shards at LLMFLEET_TT_DATA (the same synthetic stream as the other cases) instead
  of a Hugging Face dataset, and no tokenizer (the model's vocabulary is given by the shape).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.models.llama3 import TransformerModelArgs
from torchtitan.models.llama3 import get_train_spec as llama3_train_spec
from torchtitan.protocols.train_spec import register_train_spec

from llmfleet.workers.train.data import TokenData


def model_args(shape: dict[str, Any]) -> TransformerModelArgs:
    """torchtitan's FFN width is 2/3 of 4·dim rounded up to multiple_of: 256 gives SwiGLU 5632 for d=2048."""
    args = TransformerModelArgs(
        dim=shape["hidden"], n_layers=shape["layers"], n_heads=shape["heads"], n_kv_heads=shape["kvHeads"],
        vocab_size=shape["vocab"], multiple_of=256, rope_theta=shape.get("ropeTheta", 10000.0),
        max_seq_len=shape["seqLen"],
    )
    hidden = 4 * args.dim
    hidden = int(2 * hidden / 3)
    hidden = args.multiple_of * ((hidden + args.multiple_of - 1) // args.multiple_of)
    if hidden != shape["ffn"]:
        raise ValueError(f"torchtitan would build SwiGLU {hidden}, the llmfleet shape has {shape['ffn']}")
    return args


class TokenSamples(IterableDataset, Stateful):  # type: ignore[misc]
    """(input, label) sequences of one data-parallel rank, from llmfleet's loader (endless)."""

    def __init__(self, path: str, seq_len: int, rank: int, world: int) -> None:
        self.data = TokenData.open(path, seq_len, 0)
        self.rank, self.world, self.index = rank, world, 0

    def __iter__(self) -> Any:
        while True:
            x, y = self.data.batch(self.index, 0, micro_batch=1, accum=1, rank=self.rank, world=self.world)
            self.index += 1
            yield {"input": x[0]}, y[0]

    def state_dict(self) -> dict[str, Any]:
        return {"index": self.index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.index = int(state["index"])


def build_dataloader(dp_world_size: int, dp_rank: int, tokenizer: Any, job_config: Any,
                     infinite: bool = True) -> ParallelAwareDataloader:
    ds = TokenSamples(os.environ["LLMFLEET_TT_DATA"], job_config.training.seq_len, dp_rank, dp_world_size)
    return ParallelAwareDataloader(ds, dp_rank=dp_rank, dp_world_size=dp_world_size,
                                   batch_size=job_config.training.local_batch_size)


def _register() -> None:
    shape = json.loads(os.environ["LLMFLEET_TT_SHAPE"])
    spec = llama3_train_spec()
    register_train_spec("llmfleet_llama3", dataclasses.replace(
        spec, model_args={"ref": model_args(shape)}, build_dataloader_fn=build_dataloader,
        build_tokenizer_fn=None, build_validator_fn=None,
    ))


_register()
