"""Splitting one batch across devices of different speed: the arithmetic, with no torch.

Give each device a share of the batch in proportion to its measured speed, so every shard
finishes at about the same moment; in whole samples, the split whose slowest shard finishes
first (`split_sizes`). Then pay the sync: gradients travel to the main device, weights travel
back; whether the saved compute outweighs it is the model in `perf/split_time.py`.
"""
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
    """Whole-sample shares of a batch of `total` whose slowest shard, `max(n_i / s_i)`, finishes
    first: the exact optimum over all integer splits.

    Each sample in turn goes to the device that would finish it first, given what it already
    has. That greedy is optimal: after k samples no split of k can end sooner (an exchange
    argument; tests/test_hetero.py checks it against brute force). A zero-speed device gets
    nothing; a device so slow that one sample would make it the slowest shard gets nothing too.
    Ties go to the faster device, then the first.
    """
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
