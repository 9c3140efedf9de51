"""Exercise 2: one batch split across devices of different power (a GPU and the CPU).

`split.py` shares the batch in proportion to measured speeds (`perf/split_time.py` predicts
whether the saved compute outweighs the sync). This module measures those speeds, and
`HeteroDataParallel` does the split for real, one replica per device; `train_hetero` trains
with it. The page's measurements of the sync and of each split are in `lab/hetero_bench.py`.

On a machine without a GPU, `default_setup()` stands two CPU replicas in for two devices:
each gets half the cores, and the second idles after its real work as long as a device
`slowdown` times slower would still be computing. Everything it measures is labelled SIMULATED.
"""
from __future__ import annotations

import contextlib
import copy
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import torch
from torch import nn

from .config import Switches
from .devices import cpu_name, describe_devices, num_gpus, synchronize, timed
from .split import check_speeds, split_sizes
from .training import (TrainConfig, TrainResult, evaluate_accuracy, fit, load_data, make_model,
                       progress_bar)

SIMULATED = "SIMULATED"


# ---- measuring ------------------------------------------------------------------------------

def forward_backward(net: nn.Module, x, y, loss_fn, weight: float = 1.0, slowdown: float = 1.0):
    """Forward and backward of `weight * loss`; returns (mean loss, correct) as tensors.
    `slowdown > 1` is the SIMULATED throttle: after its real work the replica idles for
    `slowdown - 1` times as long, as a slower device would still be computing; idling (not
    repeating work) leaves the cores to the other replica, as a separate device would."""
    t0 = time.perf_counter()
    out = net(x)
    loss = loss_fn(out, y)
    (loss * weight).backward()
    if slowdown > 1:
        synchronize([x.device])
        time.sleep((slowdown - 1) * (time.perf_counter() - t0))
    return loss.detach(), (out.argmax(dim=1) == y).sum()


def measure_throughput(net: nn.Module, device, batch_size: int, *, steps: int = 5,
                       warmup: int = 2, slowdown: float = 1.0) -> float:
    """Images per second for forward plus backward on `device`, after `warmup` steps; on a
    copy, so `net` (its weights and BatchNorm statistics) is left untouched."""
    device = torch.device(device)
    net = copy.deepcopy(net).to(device).train()
    g = torch.Generator().manual_seed(0)
    x = torch.rand(batch_size, 1, 28, 28, generator=g).to(device)
    y = torch.randint(0, 10, (batch_size,), generator=g).to(device)
    loss_fn = nn.CrossEntropyLoss()

    def one_step():
        net.zero_grad(set_to_none=True)
        forward_backward(net, x, y, loss_fn, slowdown=slowdown)

    for _ in range(warmup):
        one_step()
    with timed([device]) as t:
        for _ in range(steps):
            one_step()
    return batch_size * steps / t.seconds


@contextlib.contextmanager
def torch_threads(n: Optional[int]):
    """Run the body with `n` intra-op CPU threads (None: leave as is), then restore."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class HeteroSetup:
    """Which devices to pair, how to label them, and (when SIMULATED) how to fake a slow one."""
    devices: tuple[str, ...]
    names: tuple[str, ...]
    slowdowns: tuple[float, ...]
    threads: Optional[int]     # CPU threads while it runs (None: unchanged)
    simulated: bool
    label: str                 # printed beside every figure


def default_setup(slowdown: float = 3.0) -> HeteroSetup:
    """`cuda:0` + `cpu` where a GPU exists; else two SIMULATED CPU replicas, one throttled."""
    if num_gpus():
        return HeteroSetup(("cuda:0", "cpu"), ("GPU", "CPU"), (1.0, 1.0), None, False,
                           describe_devices(["cuda:0", "cpu"]))
    half = max(1, (os.cpu_count() or 2) // 2)
    label = (f"{SIMULATED}: 2 replicas on {cpu_name()}, {half} thread(s) each; "
             f"replica B throttled {slowdown:g}x")
    return HeteroSetup(("cpu", "cpu"), (f"A (fast, {SIMULATED})", f"B (slow, {SIMULATED})"),
                       (1.0, float(slowdown)), half, True, label)


# ---- the heterogeneous data-parallel step ---------------------------------------------------

class HeteroDataParallel:
    """One replica per device; each batch split by speed; one optimizer step on the main device.

    The shards run concurrently in threads (PyTorch ops release the GIL). Each shard's mean loss
    is weighted by its share of the batch, so the summed gradients equal the full batch's.
    BatchNorm: each replica normalizes with its own shard's statistics (as DataParallel does);
    the running statistics are averaged, weighted by shard size, then copied to every replica.
    For the running mean of the first BN layer this is exactly the full batch's.
    Use as a context manager (it owns a thread pool). The optimizer must hold `.module`'s
    parameters, and `loss_fn` must average over the batch.
    """

    def __init__(self, net: nn.Module, devices: Sequence, speeds: Sequence[float], *,
                 slowdowns: Optional[Sequence[float]] = None):
        self.devices = [torch.device(d) for d in devices]
        self.speeds = check_speeds(speeds)
        self.slowdowns = list(slowdowns or [1.0] * len(self.devices))
        if not len(self.devices) == len(self.speeds) == len(self.slowdowns):
            raise ValueError("devices, speeds and slowdowns must have the same length")
        self.module = net.to(self.devices[0])
        self.replicas = [self.module] + [copy.deepcopy(net).to(d) for d in self.devices[1:]]
        self._pool = ThreadPoolExecutor(max_workers=len(self.devices))

    def __enter__(self) -> "HeteroDataParallel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def train(self, mode: bool = True) -> "HeteroDataParallel":
        for r in self.replicas:
            r.train(mode)
        return self

    def eval(self) -> "HeteroDataParallel":
        return self.train(False)

    def step(self, x, y, optimizer, loss_fn, sizes: Optional[Sequence[int]] = None):
        """One training step on the batch `(x, y)`; returns (sum of losses, correct) tensors."""
        sizes = list(sizes) if sizes is not None else split_sizes(len(y), self.speeds)
        if len(sizes) != len(self.devices) or sum(sizes) != len(y):
            raise ValueError(f"sizes {sizes} do not split a batch of {len(y)} over "
                             f"{len(self.devices)} devices")
        for r in self.replicas:
            r.zero_grad(set_to_none=True)
        jobs, start = {}, 0
        for i, n in enumerate(sizes):
            if n:
                jobs[i] = self._pool.submit(self._shard, i, x[start:start + n],
                                            y[start:start + n], n / len(y), loss_fn)
            start += n
        outs = {i: job.result() for i, job in jobs.items()}
        self.reduce_grads(list(jobs))
        optimizer.step()
        self._average_buffers(list(jobs), sizes)
        self.broadcast()
        main = self.devices[0]
        loss_sum = sum(outs[i][0].to(main) * sizes[i] for i in outs)
        correct = sum(outs[i][1].to(main) for i in outs)
        return loss_sum, correct

    def _shard(self, i: int, x, y, weight: float, loss_fn):
        d = self.devices[i]
        return forward_backward(self.replicas[i], x.to(d, non_blocking=True),
                                y.to(d, non_blocking=True), loss_fn, weight, self.slowdowns[i])

    def reduce_grads(self, active: list[int]) -> None:
        """Sum every active replica's gradients into the main replica's."""
        with torch.no_grad():
            for i in active:
                if i == 0:
                    continue
                for p, q in zip(self.module.parameters(), self.replicas[i].parameters()):
                    if q.grad is None:
                        continue
                    g = q.grad.to(p.device, non_blocking=True)
                    if p.grad is None:
                        p.grad = g.clone()
                    else:
                        p.grad.add_(g)

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
        with torch.no_grad():
            for r in self.replicas[1:]:
                for q, p in zip(r.parameters(), self.module.parameters()):
                    q.copy_(p)
                for q, p in zip(r.buffers(), self.module.buffers()):
                    q.copy_(p)


# ---- a small trainer ------------------------------------------------------------------------

def train_hetero(config: TrainConfig, *, setup: Optional[HeteroSetup] = None, data=None,
                 progress: bool = True) -> TrainResult:
    """Train a fresh ResNet-18 with `HeteroDataParallel` over `setup` (default: `default_setup()`).
    Each device's speed is measured first, and every batch is split by `split_sizes`.
    `config.devices` is not used: the setup names the devices."""
    setup = setup or default_setup()
    main = torch.device(setup.devices[0])
    # batches made on the main device, evaluated at the training batch size
    train_iter, test_iter = data or load_data(config, main, Switches(device_data=True))
    with torch_threads(setup.threads):
        net = make_model(config, main)
        speeds = [measure_throughput(net, d, config.batch_size, steps=2, warmup=1, slowdown=k)
                  for d, k in zip(setup.devices, setup.slowdowns)]
        with HeteroDataParallel(net, setup.devices, speeds, slowdowns=setup.slowdowns) as hdp:
            extra = dict(setup=asdict(setup), speeds=speeds,
                         sizes=split_sizes(config.batch_size, speeds))
            result = TrainResult.create(config, hardware=setup.label,
                                        num_devices=len(setup.devices),
                                        data_source=getattr(train_iter, "source", "custom"),
                                        steps_per_epoch=len(train_iter), extra=extra)
            optimizer = torch.optim.SGD(hdp.module.parameters(), lr=config.lr)
            loss_fn = nn.CrossEntropyLoss()
            bar = progress_bar(len(train_iter) * config.num_epochs, disable=not progress)

            def step(x, y):
                bar.update(1)
                return hdp.step(x, y, optimizer, loss_fn)
            with bar:
                for r in fit(step, train_iter, result, range(config.num_epochs), hdp.devices):
                    r.test_acc.append(evaluate_accuracy(hdp.module, test_iter))
    return result
