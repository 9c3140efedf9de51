"""Splitting one batch across devices of different speed, in proportion to their measured
speeds, so that every shard finishes at about the same moment (whether the saved compute
outweighs the sync is `perf/split_time.py`'s model)."""
from __future__ import annotations

import heapq
import math
from fractions import Fraction
from numbers import Real
from typing import Sequence


def check_speeds(speeds: Sequence[float]) -> list[float]:
    """Speeds as floats; negative, non-finite, non-numeric or all-zero speeds are a ValueError."""
    speeds = list(speeds)
    if not speeds:
        raise ValueError("speeds must name at least one device")
    for i, s in enumerate(speeds):
        if isinstance(s, bool) or not isinstance(s, Real) or not math.isfinite(s) or s < 0:
            raise ValueError(f"speeds must be finite numbers >= 0 (images/s), "
                             f"got speeds[{i}] = {s!r}")
    if not any(s > 0 for s in speeds):
        raise ValueError("all speeds are zero: at least one device must be able to do work")
    return [float(s) for s in speeds]


def split_sizes(total: int, speeds: Sequence[float]) -> list[int]:
    """Whole-sample shares of a batch of `total` whose slowest shard, `max(n_i / s_i)`,
    finishes first: each sample in turn goes to the device that would finish it first. That
    greedy is optimal (an exchange argument; tests/test_hetero.py checks it by brute force).
    A device too slow for even one sample gets none; ties go to the faster, then the first."""
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise ValueError(f"total must be an integer >= 0, got {total!r}")
    speeds = check_speeds(speeds)
    sizes = [0] * len(speeds)
    heap = [(Fraction(1) / Fraction(s), -s, i) for i, s in enumerate(speeds) if s > 0]
    heapq.heapify(heap)
    for _ in range(total):
        _, neg_s, i = heapq.heappop(heap)
        sizes[i] += 1
        heapq.heappush(heap, (Fraction(sizes[i] + 1) / Fraction(-neg_s), neg_s, i))
    return sizes
