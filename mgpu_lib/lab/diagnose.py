"""Why is my multi-GPU run slower? Look at the machine, then name the likely causes.

`gather_facts` measures what this machine can say: the GPUs and their names, peer access
between each pair (`torch.cuda.can_device_access_peer`), the link between them (`nvidia-smi topo
-m`, where it exists), the loader's rate alone, and where two CUDA devices exist, the share of a
DataParallel step spent outside compute. `causes` is a pure function of those `Facts`, so each
rule is tested on mocked machines. On a CPU it says what it can, and what it would check on GPUs.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
import time
from dataclasses import dataclass, field, replace
from typing import Iterable, Optional

import torch

from ..chapter import chapter_loader
from .anatomy import dp_breakdown
from ..perf.evidence import published_fit
from ..model import resnet18
from ..perf.scaling import RESNET18, dp_python_s

SMALL_BATCH = 64        # images per device below which the fixed per-step costs dominate:
                        # the model's compute for 64 images on a V100 is ~4 ms, about DataParallel's
                        # fitted Python per device (`evidence.fit`)
LOADER_MARGIN = 1.2     # a loader under 1.2x the training rate leaves the GPUs waiting
OUTSIDE_SHARE = 0.5     # half a step outside forward + backward: the step is mostly overhead
NVLINK_PREFIX = "NV"    # `nvidia-smi topo -m`: NV# is NVLink; PIX/PXB/PHB/NODE/SYS are PCIe paths


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
    outside_share: Optional[float] = None   # of a DataParallel step: scatter, replicate, gather
    cpu_cores: int = 1
    loader_workers: int = 0


@dataclass(frozen=True)
class Cause:
    """One likely cause, with the figure that points to it and what to do."""
    name: str
    figure: str
    fix: str


def _pairs(f: Facts) -> list[tuple[int, int]]:
    n = len(f.devices)
    return [(i, j) for i in range(n) for j in range(n) if i < j]


def _hardware_causes(f: Facts) -> list[Cause]:
    out = []
    if len(f.devices) < 2:
        out.append(Cause("fewer than two GPUs", f"{len(f.devices)} CUDA device(s)",
                         "d2l.try_gpu(i) falls back to the CPU, so a '2-GPU' run trains on the "
                         "same device as the 1-GPU run, with half as many steps per epoch"))
    no_p2p = [p for p in _pairs(f) if f.peer.get(p) is False]
    if no_p2p:
        names = ", ".join(f"{i}-{j}" for i, j in no_p2p)
        out.append(Cause("no peer-to-peer access", f"GPU pairs without P2P: {names}",
                         "every copy between them stages through host memory, and NCCL reaches "
                         "a few GB/s there (consumer cards such as the RTX 4090 ship with P2P "
                         "off): use DDP, a bigger per-device batch, or fewer GPUs"))
    pcie = {p: c for p, c in f.links.items() if not c.startswith(NVLINK_PREFIX)}
    if pcie and not no_p2p:
        codes = ", ".join(f"{i}-{j}: {c}" for (i, j), c in sorted(pcie.items()))
        out.append(Cause("PCIe, not NVLink", f"links from nvidia-smi topo -m: {codes}",
                         "each step's weights and gradients cross PCIe (SYS/NODE also cross the "
                         "CPUs' interconnect): DDP overlaps that traffic with the backward pass"))
    return out


def _run_causes(f: Facts) -> list[Cause]:
    n, out = max(len(f.devices), 1), []
    per_device = f.global_batch / n
    if per_device < SMALL_BATCH:
        out.append(Cause("small per-device batch", f"{per_device:g} images per device",
                         f"below {SMALL_BATCH} the fixed per-step costs outweigh the compute: "
                         "grow the global batch with the devices (and scale the lr)"))
    if f.strategy == "dp" and n > 1:
        fit = published_fit()
        lo, hi = (dp_python_s(RESNET18, n, replace(fit.base, thread_s=fit.thread_s[t]))
                  for t in (0, 2))
        out.append(Cause("DataParallel", f"{lo * 1e3:.0f} to {hi * 1e3:.0f} ms of Python per "
                         f"step on {n} GPUs (fitted to the published runs)",
                         "one process rebuilds the replicas every step and drives them from "
                         "threads under the GIL: DistributedDataParallel, one process per GPU"))
    if f.outside_share is not None and f.outside_share > OUTSIDE_SHARE:
        out.append(Cause("step mostly overhead", f"{f.outside_share:.0%} of a step outside "
                         "forward and backward (scatter, replicate, gather)",
                         "more work per step (a bigger batch) or DDP"))
    return out


def _loader_causes(f: Facts) -> list[Cause]:
    out = []
    if f.loader_images_per_s and f.train_images_per_s \
            and f.loader_images_per_s < LOADER_MARGIN * f.train_images_per_s:
        out.append(Cause("input pipeline", f"loader alone {f.loader_images_per_s:,.0f} images/s, "
                         f"training {f.train_images_per_s:,.0f} images/s",
                         "the GPUs wait for batches whatever their count: more workers, or keep "
                         "the decoded images as tensors on the device (mgpu_lib.data.DeviceLoader)"))
    if f.loader_workers and f.cpu_cores < f.loader_workers + 1:
        out.append(Cause("too few cores", f"{f.loader_workers} loader workers on {f.cpu_cores} "
                         "core(s)", "the workers compete with the training process for cores"))
    return out


def causes(f: Facts) -> list[Cause]:
    """The likely causes, hardware first, each with its figure (pure: test it on mocked facts)."""
    return _hardware_causes(f) + _run_causes(f) + _loader_causes(f)


def unchecked(f: Facts) -> list[str]:
    """What this machine could not tell, and would be checked where GPUs exist."""
    todo = []
    if len(f.devices) < 2:
        todo += ["peer access between each pair of GPUs (torch.cuda.can_device_access_peer)",
                 "the link between them: NVLink or PCIe (nvidia-smi topo -m)",
                 "the share of a DataParallel step outside compute (dataparallel.dp_breakdown)"]
    elif not f.links:
        todo.append("the link between the GPUs (nvidia-smi is not on this machine)")
    if f.train_images_per_s is None:
        todo.append("training throughput, to set against the loader's")
    return todo


def report(f: Facts) -> list[str]:
    """Lines for a notebook or a terminal: the machine, the causes, what was not checked."""
    lines = [f"{len(f.devices)} CUDA device(s)" + (": " + ", ".join(f.devices) if f.devices
                                                   else " (a CPU run: no GPU to diagnose)"),
             f"global batch {f.global_batch}, strategy {f.strategy}, {f.cpu_cores} CPU core(s)"]
    found = [f"- {c.name}: {c.figure}. {c.fix}" for c in causes(f)]
    lines += found or ["- no likely cause found"]
    lines += [f"not checked here: {t}" for t in unchecked(f)]
    return [w for ln in lines for w in textwrap.wrap(ln, 88, subsequent_indent="  ")]


def parse_topo(text: str) -> dict:
    """(i, j) -> link code from `nvidia-smi topo -m`'s matrix: its rows read 'GPU0  X  NV2 ...'
    (the header line starts with whitespace, NIC rows are skipped)."""
    rows = [ln.split() for ln in text.splitlines()
            if ln.startswith("GPU") and ln.split()[0][3:].isdigit()]
    links = {}
    for r in rows:
        i = int(r[0][3:])
        for j, code in enumerate(r[1:1 + len(rows)]):
            if i < j:
                links[(i, j)] = code
    return links


def topology() -> dict:
    """The link codes of this machine's GPUs, or {} where nvidia-smi is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    try:
        out = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=20)
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
    rest = 0
    for _, (x, _) in zip(range(batches), it):
        rest += len(x)
    now = time.perf_counter()
    # a loader too short to warm up: count its first batch, worker start included
    return rest / (now - t1) if rest else n / (now - t0)


def chapter_loader_images_per_s(batch: int, batches: int = 30) -> float:
    """Images per second of the chapter's pipeline (PIL images, ToTensor, its workers) alone, on
    random images: the host's CPU, not the disk, is what is timed."""
    images = torch.randint(0, 256, ((batches + 10) * batch, 28, 28), dtype=torch.uint8)
    labels = torch.zeros(len(images), dtype=torch.long)
    return loader_images_per_s(chapter_loader(images, labels, batch, shuffle=True), batches)


def gather_facts(global_batch: int, strategy: str = "dp", loader: Optional[Iterable] = None,
                 train_images_per_s: Optional[float] = None, width: int = 64) -> Facts:
    """Measure this machine: devices, P2P per pair, links, the loader alone, and (with two
    CUDA devices) the share of a DataParallel step outside forward and backward."""
    n = torch.cuda.device_count()
    devices = tuple(torch.cuda.get_device_name(i) for i in range(n))
    peer = {(i, j): torch.cuda.can_device_access_peer(i, j)
            for i in range(n) for j in range(n) if i < j}
    share = None
    if n >= 2:
        net = resnet18(width=width).to("cuda:0")
        t = dp_breakdown(net, [f"cuda:{i}" for i in range(n)], global_batch, steps=3)
        share = 1 - (t["forward"] + t["backward + reduce"]) / sum(t.values())
    workers = getattr(loader, "num_workers", 0)
    return Facts(devices, peer, topology() if n >= 2 else {}, global_batch, strategy,
                 loader_images_per_s(loader) if loader is not None else None,
                 train_images_per_s, share, os.cpu_count() or 1, workers)
