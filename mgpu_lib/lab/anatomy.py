"""What `nn.DataParallel` does inside one step, taken apart and measured.

`DataParallel.forward` is scatter, replicate, parallel_apply and gather; backward then sums the
replicas' gradients into device 0's parameters. Timing the pieces needs CUDA devices.
"""
from __future__ import annotations

import statistics
import time
from typing import Sequence

import torch
from torch import nn
from torch.nn.parallel import gather, parallel_apply, replicate, scatter

from ..devices import synchronize, timed


def _timed(fn, devices):
    with timed(devices) as t:
        out = fn()
    return out, t.seconds


def dp_breakdown(net: nn.Module, devices: Sequence[torch.device], batch_size: int,
                 steps: int = 5) -> dict[str, float]:
    """Mean seconds per step of each DataParallel phase, for `net` already on `devices[0]`.

    Raises:
        ValueError: without CUDA devices, where DataParallel is a pass-through.
    """
    devices = [torch.device(d) for d in devices]
    if any(d.type != "cuda" for d in devices):
        raise ValueError("the DataParallel breakdown needs CUDA devices; on the CPU "
                         "DataParallel just calls the module")
    x = torch.randn(batch_size, 1, 28, 28, device=devices[0])
    y = torch.randint(0, 10, (batch_size,), device=devices[0])
    loss_fn = nn.CrossEntropyLoss()
    totals: dict[str, float] = {}
    for step in range(steps + 1):                     # step 0 warms up, and is not counted
        t = {}
        shards, t["scatter"] = _timed(lambda: scatter(x, devices), devices)
        replicas, t["replicate"] = _timed(lambda: replicate(net, devices), devices)
        outs, t["forward"] = _timed(
            lambda: parallel_apply(replicas, [(s,) for s in shards], devices=devices), devices)
        out, t["gather"] = _timed(lambda: gather(outs, devices[0]), devices)
        _, t["backward + reduce"] = _timed(lambda: loss_fn(out, y).backward(), devices)
        net.zero_grad(set_to_none=True)
        if step:
            for k, v in t.items():
                totals[k] = totals.get(k, 0.0) + v / steps
    return totals


def replicate_seconds(net: nn.Module, devices: Sequence[torch.device], reps: int = 5) -> float:
    """Seconds per `replicate` of `net` (on `devices[0]`) onto `devices`, which DataParallel does
    every step (with one GPU, onto that GPU again): `torch.utils.benchmark`'s timer, which warms
    up first, with every one of `devices` synchronized at each reading."""
    # imported here: on a machine without CUDA, importing torch.utils.benchmark logs a warning
    # from torch's C++ extension loader, and nothing but this function needs it
    from torch.utils import benchmark

    devices = [torch.device(d) for d in devices]

    def clock() -> float:
        synchronize(devices)
        return time.perf_counter()

    timer = benchmark.Timer("replicate(net, devices)", timer=clock,
                            globals=dict(replicate=replicate, net=net, devices=devices),
                            num_threads=torch.get_num_threads())
    return timer.timeit(reps).mean


def sync_timing(device: torch.device, size: int = 4096, reps: int = 10,
                rounds: int = 6) -> tuple[float, float]:
    """Median seconds for `reps` matrix products timed without, and with, `synchronize`.

    Both loops are warmed up, then each is timed `rounds` times, alternating which goes first,
    and every timing starts with nothing queued. On a GPU the first figure only measures how
    long it took to *launch* the work; on a CPU nothing is asynchronous, so the two agree up
    to run-to-run noise.
    """
    a = torch.randn(size, size, device=device)

    def unsynced() -> float:
        synchronize([device])                        # start with nothing queued
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ a
        return time.perf_counter() - t0              # on a GPU: before the work is done

    def synced() -> float:
        with timed([device]) as t:
            for _ in range(reps):
                a @ a
        return t.seconds

    unsynced(), synced()                             # warm-up, not counted
    times: dict = {unsynced: [], synced: []}
    for r in range(rounds):
        for clock in ((unsynced, synced) if r % 2 == 0 else (synced, unsynced)):
            times[clock].append(clock())
    return statistics.median(times[unsynced]), statistics.median(times[synced])


def sharded_gradient_error(net: nn.Module, x: torch.Tensor, y: torch.Tensor,
                           shards: int = 2) -> float:
    """Largest difference between the full-batch gradient and the size-weighted mean of the
    shards' gradients: what DataParallel's gradient sum relies on.

    The net runs in eval mode, so BatchNorm uses the same statistics for every shard.
    """
    net.eval()
    loss_fn = nn.CrossEntropyLoss()
    net.zero_grad()
    loss_fn(net(x), y).backward()
    full = [p.grad.clone() for p in net.parameters()]
    combined = [torch.zeros_like(g) for g in full]
    for xs, ys in zip(x.chunk(shards), y.chunk(shards)):
        net.zero_grad()
        loss_fn(net(xs), ys).backward()
        for c, p in zip(combined, net.parameters()):
            c += p.grad * (len(ys) / len(y))
    net.zero_grad()
    return max((f - c).abs().max().item() for f, c in zip(full, combined))
