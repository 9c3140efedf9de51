"""How long training takes, for the pages' setup cells and `tools/gpu_check.py`: on a GPU, the
datasheet model at `evidence`'s fitted overheads; on a CPU, the recorded 2-core rate, scaled to
the width by FLOPs. Evaluating an image costs a third of training one (forward only)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from .evidence import band, published_fit, workload
from .scaling import DeviceSpec, Overheads, pair_link, predict_step_time


@dataclass(frozen=True)
class Job:
    """Training a page does: `runs` runs of `epochs` epochs, or `steps` loose steps (benchmarks)."""
    what: str
    runs: int
    width: int
    batch: int
    epochs: int = 0
    train_images: int = 0
    test_images: int = 0
    steps: int = 0
    devices: int = 1            # GPUs the run uses (DataParallel)

    @property
    def trained(self) -> float:
        return self.runs * (self.epochs * self.train_images + self.steps * self.batch)

    @property
    def evaluated(self) -> float:
        return self.runs * self.epochs * self.test_images


def step_seconds(spec: DeviceSpec, batch: float, width: int = 64, devices: int = 1,
                 overheads: Optional[Overheads] = None) -> float:
    """One DataParallel training step of `batch` images on `devices` GPUs of `spec`, over
    `scaling.pair_link`, at `overheads` (default: the middle of the published runs' fit)."""
    o = overheads or published_fit().overheads(spec)
    return predict_step_time(devices, batch, spec, pair_link(spec), "dp",
                             workload=workload(width), overheads=o).total


def gpu_seconds(jobs: Sequence[Job], spec, overheads: Optional[Overheads] = None) -> float:
    """Training seconds for `jobs` on GPUs of `spec` (DataParallel over `job.devices`)."""
    total = 0.0
    for j in jobs:
        w = workload(j.width)
        step = step_seconds(spec, j.batch, j.width, j.devices, overheads)
        total += step * j.trained / j.batch + (step * j.evaluated / j.batch) / w.train_factor
    return total


def cpu_rates(records) -> dict[str, dict[int, float]]:
    """Achieved training FLOP/s of each 2-core CPU's fast loop in fp32, by width, from its
    `bench` records (`bench_cpu.jsonl`: `book.pages.recorded_cpu_rates`)."""
    rates: dict[str, dict[int, float]] = {}
    for r in records:
        fast = r["modes"]["fast"]
        if r["device"] == "cpu" and "bf16" not in fast["describe"]:
            cpu = f"{r['hardware'].split(',')[0]} ({r['cpu_bf16']})"
            flops = fast["median"] * workload(r["width"]).train_flops
            rates.setdefault(cpu, {})[r["width"]] = flops
    return rates


def cpu_seconds(jobs: Sequence[Job], flops_by_width: dict[int, float]) -> float:
    """Training seconds for `jobs` on a CPU that achieves `flops_by_width` (the recorded width
    nearest each job's is used)."""
    total = 0.0
    for j in jobs:
        rate = flops_by_width[min(flops_by_width, key=lambda w: abs(w - j.width))]
        w = workload(j.width)
        total += (j.trained + j.evaluated / w.train_factor) * w.train_flops / rate
    return total


def gpu_band(jobs: Sequence[Job], spec: DeviceSpec) -> tuple[float, float]:
    """(low, high) training seconds over the fitted overheads' corners (`evidence.band`)."""
    return band(lambda o: gpu_seconds(jobs, spec, o), spec, published_fit())[::2]
