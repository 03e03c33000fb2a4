"""KV admission: whether a replica's engine can start a prompt now, from its scraped KV cache state.

The estimated-ttft scorer (builtin.py) counts one TTFT objective of wait on a replica that cannot (docs/router.md,
"KV admission").
"""

from __future__ import annotations

from llmfleet.router.plugins.base import ReplicaState

# A replica whose engine queues requests (vllm:num_requests_waiting > 0) with its KV cache at least
# this full cannot start a new request until running ones finish and free blocks. With long answers (reasoning
# style: thousands of tokens, each request's blocks held for minutes) that wait is far beyond any prefill estimate,
# and the prefix cache holding a session's history there is what keeps sending it back. Such a replica's estimate
# counts one TTFT objective of wait (it is expected to miss), so a request goes to a replica that can admit it
# unless every candidate is blocked alike. vLLM admits a prompt only when all its blocks fit, so a blocked
# engine's usage stays within a few percent of full; a queue with more free KV than that waits for something else
# (the batch limit, the step's token budget), which the prefill estimate covers. docs/router.md, "KV admission".
KV_ADMISSION_FULL = 0.95


def cannot_admit(r: ReplicaState, prompt_tokens: int, tokens_per_block: int) -> bool:
    """Whether `r`'s engine cannot start a prompt of `prompt_tokens` now (scraped state, not checked for staleness
    here): it queues requests with its KV cache at least KV_ADMISSION_FULL full, or the prompt's blocks do not fit
    in the free part of its cache (`cache_capacity_blocks` known; engine blocks of `kv_block_tokens` tokens, else of
    `tokens_per_block`, the prefix index's, which is the engine's unless the router's block size is set). A
    prompt references every one of its blocks while it runs, those its prefix cache holds too (vLLM counts a cached
    block no running request uses as free), so a long conversation's next turn needs its whole history's blocks
    free: a 70k-token history is 8 % of an 8B model's cache on an H200, which a replica busy with long answers lacks
    well before the 95 % that its waiting queue shows."""
    if r.waiting > 0 and r.kv_usage >= KV_ADMISSION_FULL:
        return True
    cap, block = r.cache_capacity_blocks, r.kv_block_tokens or tokens_per_block
    if not cap or block <= 0:
        return False
    need = -(-prompt_tokens // block)
    return r.kv_usage + need / cap > 1.0
