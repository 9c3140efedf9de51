"""Exercise 2: one batch split across devices of different power (a GPU and the CPU), one
replica per device. The speeds and a SIMULATED pair where there is no GPU are in
`lab/hetero_bench.py`."""
from __future__ import annotations

import copy
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional, Sequence

import torch
from torch import nn

from .devices import synchronize
from .split import split_sizes


def forward_backward(net: nn.Module, x, y, loss_fn, weight: float = 1.0, slowdown: float = 1.0):
    """Forward and backward of `weight * loss`; returns (mean loss, correct) as tensors.
    `slowdown > 1` is the SIMULATED throttle: the replica then idles `slowdown - 1` times as
    long as it worked, as a slower device would still be computing, leaving the cores free."""
    t0 = time.perf_counter()
    out = net(x)
    loss = loss_fn(out, y)
    (loss * weight).backward()
    if slowdown > 1:
        synchronize([x.device])
        time.sleep((slowdown - 1) * (time.perf_counter() - t0))
    return loss.detach(), (out.argmax(dim=1) == y).sum()


class HeteroDataParallel:
    """One replica per device; each batch split by speed; one optimizer step on the main device.

    The shards run in threads (PyTorch ops release the GIL). Each shard's mean loss is weighted
    by its share of the batch, so the summed gradients equal the full batch's. BatchNorm
    normalizes each shard by its own statistics (as DataParallel does); the running statistics
    are averaged, weighted by shard size. A context manager (it owns a thread pool); the
    optimizer holds `.module`'s parameters, and `loss_fn` averages over the batch.
    """

    def __init__(self, net: nn.Module, devices: Sequence, speeds: Sequence[float], *,
                 slowdowns: Optional[Sequence[float]] = None):
        self.devices = [torch.device(d) for d in devices]
        self.speeds = [float(s) for s in speeds]
        self.slowdowns = list(slowdowns or [1.0] * len(self.devices))
        self.module = net.to(self.devices[0])
        self.replicas = [self.module] + [copy.deepcopy(net).to(d) for d in self.devices[1:]]
        self._pool = ThreadPoolExecutor(max_workers=len(self.devices))

    def __enter__(self) -> "HeteroDataParallel":
        return self

    def __exit__(self, *exc) -> None:
        self._pool.shutdown(wait=True)

    def train(self, mode: bool = True) -> "HeteroDataParallel":
        for r in self.replicas:
            r.train(mode)
        return self

    def step(self, x, y, optimizer, loss_fn, sizes: Optional[Sequence[int]] = None):
        """One training step on the batch `(x, y)`; returns (sum of losses, correct) tensors."""
        sizes = list(sizes) if sizes is not None else split_sizes(len(y), self.speeds)
        for r in self.replicas:
            r.zero_grad(set_to_none=True)
        active = [i for i, n in enumerate(sizes) if n]
        xs, ys = x.split(sizes), y.split(sizes)
        jobs = [self._pool.submit(self._shard, i, xs[i], ys[i], sizes[i] / len(y), loss_fn)
                for i in active]
        outs = [job.result() for job in jobs]
        self.reduce_grads(active)
        optimizer.step()
        self._average_buffers(active, sizes)
        self.broadcast()
        main = self.devices[0]
        loss_sum = sum(loss.to(main) * sizes[i] for i, (loss, _) in zip(active, outs))
        correct = sum(right.to(main) for _, right in outs)
        return loss_sum, correct

    def _shard(self, i: int, x, y, weight: float, loss_fn):
        d = self.devices[i]
        return forward_backward(self.replicas[i], x.to(d, non_blocking=True),
                                y.to(d, non_blocking=True), loss_fn, weight, self.slowdowns[i])

    def reduce_grads(self, active: list[int]) -> None:
        """Sum every active replica's gradients into the main replica's."""
        with torch.no_grad():
            for i in (i for i in active if i != 0):
                for p, q in zip(self.module.parameters(), self.replicas[i].parameters()):
                    if q.grad is not None:
                        g = q.grad.to(p.device, non_blocking=True)
                        p.grad = g.clone() if p.grad is None else p.grad.add_(g)

    def _average_buffers(self, active: list[int], sizes: Sequence[int]) -> None:
        """Running statistics: shard-size-weighted mean of the replicas that saw data."""
        if active == [0] or not self.module.training:
            return
        total = sum(sizes[i] for i in active)
        buffers = [list(r.buffers()) for r in self.replicas]
        with torch.no_grad():
            for k, b in enumerate(buffers[0]):
                parts = [buffers[i][k].to(b.device) for i in active]
                if b.is_floating_point():
                    b.copy_(sum(p * (sizes[i] / total) for p, i in zip(parts, active)))
                else:                         # num_batches_tracked: every active one counted
                    b.copy_(torch.stack(parts).max())

    def broadcast(self) -> None:
        """Copy the main replica's weights and buffers to every other replica."""
        for r in self.replicas[1:]:
            r.load_state_dict(self.module.state_dict())     # copies into r's own tensors
