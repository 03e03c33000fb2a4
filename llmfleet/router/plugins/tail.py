"""The fleet's TTFT tail level and the estimated-TTFT scorer's tail band (see `tail_banded`)."""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Sequence

# The fleet's unavoidable TTFT tail (see `TailLevel`): the percentile is the one the TTFT objective is stated at
# (RouterConfig's slo.ttft_p95_ms), so the level is what the objective can at best reach with this traffic; the
# window is the last TAIL_WINDOW routed requests: about 50 beyond the 95th percentile, so one request moves the
# level little, and a changed workload replaces it within ~1,000 requests (seconds to minutes at production rates).
TAIL_QUANTILE = 0.95
TAIL_WINDOW = 1024


class TailLevel:
    """The `quantile` of the last `window` requests' unavoidable TTFT: each request's own prefill on its
    best-cached candidate with nothing queued (min over candidates of uncached work / rate).

    No router can bring the TTFT tail below this level with the traffic it is given (long cold prompts make it),
    so queueing that keeps a request under it does not move the tail. 0 until the window holds enough samples
    for one beyond the quantile (1 / (1 - quantile)): an idle or new router is plain TTFT.
    """

    def __init__(self, quantile: float = TAIL_QUANTILE, window: int = TAIL_WINDOW) -> None:
        if not 0.0 < quantile < 1.0 or window < 1:
            raise ValueError("tail level needs 0 < quantile < 1 and window >= 1")
        self.quantile = quantile
        self.min_samples = math.ceil(1.0 / (1.0 - quantile))
        self._recent: deque[float] = deque(maxlen=window)
        self._sorted: list[float] = []

    def add(self, seconds: float) -> None:
        recent = self._recent
        if len(recent) == recent.maxlen:
            old = recent[0]
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        recent.append(seconds)
        bisect.insort(self._sorted, seconds)

    def level(self) -> float:
        s = self._sorted
        if len(s) < self.min_samples:
            return 0.0
        return s[min(len(s) - 1, int(self.quantile * len(s)))]


def tail_banded(costs: Sequence[float], work: Sequence[float], level: float) -> list[float]:
    """`costs` where a replica that would recompute part of the prompt's cached prefix costs at least the fleet's
    TTFT tail level.

    Holders: the candidates that need the least prefill work (they hold the prompt's longest cached prefix);
    their costs are unchanged. Every other candidate costs at least `level` (`TailLevel`, bounded by the TTFT
    objective): while a holder's cost is under the level, a faster replica gains nothing and the holder keeps
    the request; above it, plain estimated TTFT decides, against the level instead of a lower cost.

    Why: a request sent away from a busy holder saves its own wait but recomputes the prefix elsewhere (work
    that delays what is routed there next, and a second cache copy that evicts others' blocks). The tail level
    is the TTFT that the fleet's own traffic puts at the objective's percentile anyway (long cold prompts), so a
    request that starts under it does not move the tail: the diversion buys nothing that the objective measures.
    The level is in seconds of the scorer's own estimates, measured on the traffic: nothing to fit per trace.
    Decisions do not change for a prompt no candidate holds more of than the others (nobody is raised), in an
    idle fleet (every cost is the request's own prefill, a holder's the least) or before the router has a level.
    """
    if level <= 0.0:
        return list(costs)
    w_min = min(work)
    return [level if w > w_min and c < level else c for c, w in zip(costs, work, strict=True)]
