"""Whether a split pays: a split's predicted step time, the best split, and the break-even.

A `split.split_sizes` step is the slowest shard plus the sync, set against the fastest device
alone. Exercise 2 reads these, with speeds and sync from `lab/hetero_bench.py`."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from ..split import split_sizes


def predict_hetero_step(speeds: Sequence[float], sizes: Sequence[int], sync_s: float) -> float:
    """Seconds per step: the slowest shard (inf for one with work and speed 0), plus `sync_s`
    when two or more devices work."""
    shard_s = [n / s if s > 0 else math.inf for n, s in zip(sizes, speeds) if n > 0]
    return max(shard_s, default=0.0) + (sync_s if len(shard_s) > 1 else 0.0)


@dataclass(frozen=True)
class SplitPlan:
    """A split, its predicted step time, and the fastest device alone for comparison."""
    sizes: tuple[int, ...]
    step_s: float       # predicted: slowest shard + sync (none when only one device has work)
    alone_s: float      # predicted: the whole batch on the fastest device, no sync

    @property
    def speedup(self) -> float:
        return self.alone_s / self.step_s


def best_split(total: int, speeds: Sequence[float], sync_s: float) -> SplitPlan:
    """The split with the smallest slowest shard (`split_sizes`), its predicted step time and
    its predicted speedup over the fastest device alone."""
    sizes = split_sizes(total, speeds)
    return SplitPlan(tuple(sizes), predict_hetero_step(speeds, sizes, sync_s), total / max(speeds))


def shard_grid(total: int, ideal: int) -> list[int]:
    """Sample counts for the slower device to try: `ideal`, and 9 from 0 to about 3 x ideal."""
    top = min(total, max(3 * ideal, 8))
    return sorted({round(top * k / 8) for k in range(9)} | {ideal})


def break_even_slowdown(total: int, speed: float, sync_s: float) -> Optional[float]:
    """How many times slower than a device of `speed` (images/s) a second one can be before a
    share of `total` stops paying, sync included: the k where `best_split`'s speedup falls to 1
    (bisection). None: even an equal device does not pay for the sync."""
    pays = lambda k: best_split(total, [speed, speed / k], sync_s).speedup > 1.0
    if not pays(1.0):
        return None
    lo, hi = 1.0, 2.0
    while pays(hi):      # ends: once k > total, one image there outlasts the whole batch
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if pays(mid) else (lo, mid)
    return (lo + hi) / 2
