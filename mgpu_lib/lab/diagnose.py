"""Why is my multi-GPU run slower? Look at the machine, then name the likely causes, costliest
first. `causes` is a pure function of the `Facts` that `gather_facts` measures, so each rule is
tested on described machines. Thresholds and costs come from the step-time model at the
published runs' fit; without a datasheet (or on a CPU) it says what it can, and what to check.
"""
from __future__ import annotations

import os
import subprocess
import textwrap
import time
from dataclasses import dataclass, field
from itertools import combinations, islice
from typing import Iterable, Iterator, Optional

import torch

from .anatomy import dp_breakdown
from ..perf.evidence import published_fit, workload
from ..model import resnet18
from ..perf.scaling import (DeviceSpec, LinkSpec, Overheads, StepTime, compute_rate,
                            dp_python_s, pair_link, predict_step_time, spec_for_name)


@dataclass(frozen=True)
class Facts:
    """What a machine says about itself, and about the run being diagnosed."""
    devices: tuple = ()                     # CUDA device names; () on a CPU
    peer: dict = field(default_factory=dict)    # (i, j) -> can i read j's memory directly
    links: dict = field(default_factory=dict)   # (i, j) -> `nvidia-smi topo -m` code, e.g. "NV2"
    global_batch: int = 256
    strategy: str = "dp"                    # "dp" (nn.DataParallel) or "ddp"
    loader_images_per_s: Optional[float] = None  # the loader alone, measured
    train_images_per_s: Optional[float] = None   # the training run, measured
    outside_s: Optional[float] = None       # of a DataParallel step: scatter, replicate, gather
    compute_s: Optional[float] = None       # of the same step: forward and backward
    cpu_cores: int = 1
    loader_workers: int = 0
    width: int = 64


@dataclass(frozen=True)
class Cause:
    """One likely cause: its cost per step (None: not predicted), its figure and its fix."""
    name: str
    figure: str
    fix: str
    ms: Optional[float] = None
    how: str = "predicted"                  # or "measured"

    def line(self) -> str:
        cost = (f"{self.ms:.1f} ms per step, {self.how}" if self.ms is not None
                else "cost not predicted")
        return f"- {self.name} ({cost}): {self.figure}. {self.fix}"


@dataclass(frozen=True)
class Machine:
    """The described machine as the model sees it: the GPU's datasheet and the pair's link."""
    spec: DeviceSpec
    link: LinkSpec
    n: int
    width: int
    overheads: Overheads                    # `machine`'s: the middle of the published runs' fit

    def step(self, batch: float, strategy: str, link: Optional[LinkSpec] = None,
             n: Optional[int] = None) -> StepTime:
        return predict_step_time(n or self.n, batch, self.spec, link or self.link, strategy,
                                 workload=workload(self.width), overheads=self.overheads)

    def rate(self) -> float:
        """Images per second one GPU computes."""
        return compute_rate(self.spec, workload(self.width), self.overheads.efficiency)


def machine(f: Facts) -> Optional[Machine]:
    """The model of `f`'s machine, or None without a datasheet for its first GPU (`scaling.spec_for_name`).
    The link is `pair_link` of the slowest pair the facts describe (P2P off, then topo code)."""
    spec = spec_for_name(f.devices[0]) if f.devices else None
    if spec is None:
        return None
    links = [pair_link(spec, f.peer.get(p), f.links.get(p))
             for p in combinations(range(len(f.devices)), 2)]
    link = min(links, key=lambda k: k.gbs) if links else pair_link(spec)
    return Machine(spec, link, max(len(f.devices), 1), f.width, published_fit().overheads(spec))


def small_batch(m: Machine, strategy: str = "dp") -> float:
    """The per-device batch below which a step costs more in what does not scale with its
    images (launches, the optimizer, idle SMs, DataParallel's Python, unhidden communication)
    than in computing them: the compute rate x those fixed costs, from the model."""
    rate = m.rate()
    return rate * (m.step(m.n, strategy).total - 1 / rate)


def _hardware_causes(f: Facts, m: Optional[Machine]) -> Iterator[Cause]:
    link_fix = ("DDP overlaps that traffic with the backward pass; or fewer GPUs"
                if f.strategy == "dp" else "a bigger per-device batch, or gradient accumulation "
                "(`no_sync`), all-reduces less often per image; or fewer GPUs")
    if len(f.devices) < 2:
        ms = (1e3 * (m.step(f.global_batch, "dp").total - m.step(f.global_batch, "dp", n=2).total)
              if m else None)
        yield Cause("fewer than two GPUs", f"{len(f.devices)} CUDA device(s)",
                    "d2l.try_gpu(i) falls back to the CPU, so a '2-GPU' run trains on the same "
                    "device as the 1-GPU run, with half as many steps per epoch", ms)
    no_p2p = [p for p in combinations(range(len(f.devices)), 2) if f.peer.get(p) is False]
    if no_p2p:
        names = ", ".join(f"{i}-{j}" for i, j in no_p2p)
        ms = (1e3 * (m.step(f.global_batch, f.strategy).total
                     - m.step(f.global_batch, f.strategy, pair_link(m.spec, True)).total)
              if m else None)
        yield Cause("no peer-to-peer access", f"GPU pairs without P2P: {names}; every copy "
                    "between them stages through host memory (GeForce cards such as the RTX "
                    "4090 ship with P2P off)", link_fix, ms)
    # `nvidia-smi topo -m`: NV# is NVLink; PIX/PXB/PHB/NODE/SYS are PCIe paths
    pcie = {p: c for p, c in f.links.items() if not c.startswith("NV")}
    if pcie and not no_p2p:
        codes = ", ".join(f"{i}-{j}: {c}" for (i, j), c in sorted(pcie.items()))
        ms = 1e3 * m.step(f.global_batch, f.strategy).communication if m else None
        yield Cause("PCIe, not NVLink", f"links from nvidia-smi topo -m: {codes}; each step's "
                    "weights and gradients cross PCIe (SYS/NODE also cross the CPUs' "
                    "interconnect)", link_fix, ms)


def _run_causes(f: Facts, m: Optional[Machine]) -> Iterator[Cause]:
    n = max(len(f.devices), 1)
    per = f.global_batch / n
    if m and per < (small := small_batch(m, f.strategy)):
        # a device's own fixed costs: launches, the optimizer, SMs a small batch leaves idle
        fixed = m.step(per, f.strategy, n=1).total - per / m.rate()
        yield Cause("small per-device batch", f"{per:g} images per device, below the "
                    f"{small:.0f} at which this machine's fixed per-step costs equal its compute",
                    "grow the global batch with the devices (and scale the lr)", 1e3 * fixed)
    if f.strategy == "dp" and n > 1:
        fit, spec = published_fit(), m.spec if m else None
        lo, hi = (dp_python_s(workload(f.width), n, fit.overheads(spec, 1, t)) for t in (0, 2))
        ms = (1e3 * (m.step(f.global_batch, "dp").total - m.step(f.global_batch, "ddp").total)
              if m else None)
        python = f"{1e3 * lo:.0f} to {1e3 * hi:.0f}" if hi > lo else f"{1e3 * lo:.0f}"
        yield Cause("DataParallel", f"{python} ms of Python per step on {n} GPUs "
                    f"({fit.basis(spec)}), and none of its traffic overlaps the backward pass",
                    "one process rebuilds the replicas every step and drives them from threads "
                    "under the GIL: DistributedDataParallel, one process per GPU", ms)
    if f.strategy == "dp" and None not in (f.outside_s, f.compute_s) and f.outside_s > f.compute_s:
        yield Cause("step mostly overhead", f"{1e3 * f.outside_s:.1f} ms of a step outside "
                    f"forward and backward (scatter, replicate, gather), more than its "
                    f"{1e3 * f.compute_s:.1f} ms inside", "more work per step (a bigger batch) "
                    "or DDP", 1e3 * f.outside_s, "measured")


def _loader_causes(f: Facts, m: Optional[Machine]) -> Iterator[Cause]:
    # the GPUs' step: the model's where it has a datasheet, else the run's as measured
    step = (m.step(f.global_batch, f.strategy).total if m else
            f.global_batch / f.train_images_per_s if f.train_images_per_s else None)
    load = f.global_batch / f.loader_images_per_s if f.loader_images_per_s else None
    if load is not None and step is not None and load > step:
        trained = (f"the GPUs {f.global_batch / step:,.0f} images/s (predicted)" if m else
                   f"training {f.train_images_per_s:,.0f} images/s")
        yield Cause("input pipeline", f"loader alone {f.loader_images_per_s:,.0f} images/s, "
                    f"{trained}", "the GPUs wait for batches whatever their count: more "
                    "workers, or keep the decoded images as tensors on the device "
                    "(mgpu_lib.data.DeviceLoader)", 1e3 * (load - step),
                    "predicted" if m else "measured")
    if f.loader_workers and f.cpu_cores < f.loader_workers + 1:
        yield Cause("too few cores", f"{f.loader_workers} loader workers on {f.cpu_cores} "
                    "core(s)", "the workers compete with the training process for cores")


def causes(f: Facts) -> list[Cause]:
    """The likely causes, costliest first (those without a predicted cost last). What the model
    says costs nothing (a PCIe all-reduce DDP hides behind backward) is no cause."""
    m = machine(f)
    found = [c for rule in (_hardware_causes, _run_causes, _loader_causes) for c in rule(f, m)
             if c.ms is None or c.ms >= 0.05]
    return sorted(found, key=lambda c: -c.ms if c.ms is not None else float("inf"))


def unchecked(f: Facts) -> list[str]:
    """What this machine could not tell, and would be checked where GPUs exist."""
    todo = []
    if len(f.devices) < 2:
        todo += ["peer access between each pair of GPUs (torch.cuda.can_device_access_peer)",
                 "the link between them: NVLink or PCIe (nvidia-smi topo -m)",
                 "the share of a DataParallel step outside compute (anatomy.dp_breakdown)"]
    elif not f.links:
        todo.append("the link between the GPUs (nvidia-smi is not on this machine)")
    if f.devices and machine(f) is None:
        todo.append(f"costs and thresholds: no datasheet for {f.devices[0]}")
    if f.train_images_per_s is None:
        todo.append("training throughput, to set against the loader's")
    return todo


def report(f: Facts) -> list[str]:
    """Lines for a notebook or a terminal: the machine, the causes, what was not checked."""
    m = machine(f)
    lines = [f"{len(f.devices)} CUDA device(s)" + (": " + ", ".join(f.devices) if f.devices
                                                   else " (a CPU run: no GPU to diagnose)"),
             f"global batch {f.global_batch}, strategy {f.strategy}, {f.cpu_cores} CPU core(s)"
             + (f"; link as modelled: {m.link.name}, {m.link.gbs:g} GB/s" if m and m.n > 1
                else "")]
    lines += [c.line() for c in causes(f)] or ["- no likely cause found"]
    lines += [f"not checked here: {t}" for t in unchecked(f)]
    return [w for ln in lines for w in textwrap.wrap(ln, 88, subsequent_indent="  ")]


def parse_topo(text: str) -> dict:
    """(i, j) -> link code from `nvidia-smi topo -m`'s matrix: its rows read 'GPU0  X  NV2 ...'
    (the header line starts with whitespace, NIC rows are skipped)."""
    rows = [ln.split() for ln in text.splitlines()
            if ln.startswith("GPU") and ln.split()[0][3:].isdigit()]
    return {(int(r[0][3:]), j): code for r in rows for j, code in enumerate(r[1:1 + len(rows)])
            if int(r[0][3:]) < j}


def topology() -> dict:
    """The link codes of this machine's GPUs, or {} where nvidia-smi is absent or fails."""
    try:       # an absent nvidia-smi raises FileNotFoundError, an OSError
        out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                             timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_topo(out.stdout) if out.returncode == 0 else {}


def loader_images_per_s(loader: Iterable, batches: int = 20) -> float:
    """Images per second the loader delivers alone (no training), over its first `batches`
    batches after one of warm-up (worker start)."""
    it = iter(loader)
    t0 = time.perf_counter()
    n = len(next(it)[0])
    t1 = time.perf_counter()
    rest = sum(len(x) for x, _ in islice(it, batches))
    now = time.perf_counter()
    # a loader too short to warm up: count its first batch, worker start included
    return rest / (now - t1) if rest else n / (now - t0)


def gather_facts(global_batch: int, strategy: str = "dp", *, loader: Iterable,
                 train_images_per_s: Optional[float] = None, width: int = 64) -> Facts:
    """Measure this machine's `Facts` (the DataParallel step's split with two CUDA devices)."""
    n = torch.cuda.device_count()
    devices = tuple(torch.cuda.get_device_name(i) for i in range(n))
    peer = {(i, j): torch.cuda.can_device_access_peer(i, j) for i, j in combinations(range(n), 2)}
    outside = inside = None
    if n >= 2:
        net = resnet18(width=width).to("cuda:0")
        t = dp_breakdown(net, [f"cuda:{i}" for i in range(n)], global_batch, steps=3)
        inside = t["forward"] + t["backward + reduce"]
        outside = sum(t.values()) - inside
    return Facts(devices, peer, topology() if n >= 2 else {}, global_batch, strategy,
                 loader_images_per_s(loader), train_images_per_s, outside, inside,
                 os.cpu_count() or 1, getattr(loader, "num_workers", 0), width)
