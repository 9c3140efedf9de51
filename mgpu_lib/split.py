"""Splitting one batch across devices of different speed, in proportion to their measured
speeds, so that every shard finishes at about the same moment (whether the saved compute
outweighs the sync is `perf/split_time.py`'s model)."""
from __future__ import annotations

import heapq
from fractions import Fraction
from typing import Sequence


def split_sizes(total: int, speeds: Sequence[float]) -> list[int]:
    """Whole-sample shares of a batch of `total` whose slowest shard, `max(n_i / s_i)`,
    finishes first: each sample in turn goes to the device that would finish it first. That
    greedy is optimal (an exchange argument; tests/test_hetero.py checks it by brute force).
    A device too slow for even one sample gets none; ties go to the faster, then the first.
    `speeds` are images/s (>= 0, one of them > 0)."""
    sizes = [0] * len(speeds)
    heap = [(Fraction(1) / Fraction(s), -s, i) for i, s in enumerate(speeds) if s > 0]
    heapq.heapify(heap)
    for _ in range(total):
        _, neg_s, i = heapq.heappop(heap)
        sizes[i] += 1
        heapq.heappush(heap, (Fraction(sizes[i] + 1) / Fraction(-neg_s), neg_s, i))
    return sizes
