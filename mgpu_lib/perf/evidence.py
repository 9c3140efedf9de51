"""The step-time model held against measurements.

Two kinds of evidence: a calibration on the hardware at hand (`calibrate`, `leave_one_out`),
and the published runs of 12.6 (`published`). From the runs that name their GPU, `fit` takes
only what no datasheet gives: the achieved fraction of FP32 peak of each GPU (from its 1-GPU
runs) and DataParallel's Python per device and step (`thread_s`, from the 2-GPU runs). The
spread of those fits is each prediction's band (`band`, `compare`), and `held_out` predicts
every published figure from a fit that has not seen it.
"""
from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence

from .published import PublishedRun, pairs, runs
from .scaling import (DEVICES, LINKS, RESNET18, DeviceSpec, LinkSpec, Overheads, Workload,
                      loader_rate, predict_epoch_time, spec_for_name)

NUM_IMAGES = 60_000            # Fashion-MNIST's training set: the published runs' epoch
UNDECIDED = "cannot be told from the model"
@dataclass(frozen=True)
class Calibration:
    """step seconds = step_s + batch / images_per_second, fitted by least squares."""
    images_per_second: float
    step_s: float
    rms_error_s: float

    def step_time(self, batch: float) -> float:
        return self.step_s + batch / self.images_per_second

    def achieved_tflops(self, workload: Workload = RESNET18) -> float:
        return self.images_per_second * workload.train_flops / 1e12


def calibrate(measurements: Sequence[tuple[float, float]]) -> Calibration:
    """Fit (per-device batch, step seconds) pairs with a line; the intercept is the per-step
    overhead, the slope the seconds per image. Where the line cannot be trusted (one batch size,
    a negative intercept, or noise making time fall with batch), fall back to a line through the
    origin: all cost per image, which is always positive for positive measurements."""
    pts = [(float(b), float(t)) for b, t in measurements]
    if not pts or any(b <= 0 or t <= 0 for b, t in pts):
        raise ValueError("calibrate needs positive (batch, seconds) measurements")
    n = len(pts)
    mb, mt = sum(b for b, _ in pts) / n, sum(t for _, t in pts) / n
    spread = sum((b - mb) ** 2 for b, _ in pts)
    slope = sum((b - mb) * (t - mt) for b, t in pts) / spread if spread else 0.0
    step_s = mt - slope * mb
    if slope <= 0 or step_s < 0:
        step_s, slope = 0.0, sum(b * t for b, t in pts) / sum(b * b for b, _ in pts)
    rms = math.sqrt(sum((step_s + slope * b - t) ** 2 for b, t in pts) / n)
    return Calibration(1.0 / slope, step_s, rms)


def half_speed_batch(rows: Sequence[dict]) -> Optional[float]:
    """The batch whose images/s is half the largest batch's, interpolated in log2(batch), from
    rows of `bench.batch_curve` (ascending batches); None when even the smallest batch runs
    faster than that."""
    target = rows[-1]["images_per_second"] / 2
    for lo, hi in zip(rows, rows[1:]):
        a, b = lo["images_per_second"], hi["images_per_second"]
        if a < target <= b:
            x = (target - a) / (b - a)
            return 2 ** ((1 - x) * math.log2(lo["batch"]) + x * math.log2(hi["batch"]))
    return None


def leave_one_out(measurements: Sequence[tuple[float, float]]) -> list[dict]:
    """For each measurement: calibrate on the others, predict it, report the relative error.
    An honest check: no point is predicted by a fit that has seen it."""
    rows = []
    for i, (b, t) in enumerate(measurements):
        rest = [m for j, m in enumerate(measurements) if j != i]
        pred = calibrate(rest).step_time(b)
        rows.append(dict(batch=b, measured_s=t, predicted_s=pred, error=(pred - t) / t))
    return rows


def cpu_spec(cal: Calibration, name: str, workload: Workload = RESNET18,
             cores: int = 1) -> DeviceSpec:
    """A DeviceSpec for a CPU from its calibrated rate (split across `cores` worker processes):
    its 'peak' is what it achieved, so use it with mfu=1."""
    tflops = cal.achieved_tflops(workload) / cores
    return DeviceSpec(name, tflops, None, None, 20.0, 0.0, "measured here (calibrate)")


def calibrated_overheads(cal: Calibration) -> Overheads:
    """Overheads for predictions from a calibration: its intercept is the whole per-step cost
    (launches, optimizer, Python), and its rate already reflects the batch it ran at."""
    return Overheads(mfu=1.0, half_batch=0.0, step_s=cal.step_s, thread_s=0.0, tensor_s=0.0,
                     optimizer_passes=0.0)


def check_on_runs(records: Sequence, ddp_runs: Sequence, workload: Workload, num_images: int,
                  threads: int, link: LinkSpec) -> tuple[Calibration, list[tuple]]:
    """Calibrate on the finished 1-process sweep `records` (seconds per step against batch),
    then predict every batch by a fit that never saw it (leave one out), and every DDP run by
    the full fit with each process at its share of the `threads`.

    Returns the full calibration and [(configuration, measured s/epoch, predicted s/epoch)]."""
    by_batch: dict = {}
    for r in records:
        if r.status == "ok":
            by_batch.setdefault(r.config["batch_size"], []).append(r)
    measured = [(b, statistics.fmean(r.sec_per_epoch / r.steps_per_epoch for r in rs))
                for b, rs in sorted(by_batch.items())]
    cal = calibrate(measured)

    def epoch(n, batch, c, rate):
        trained = num_images // batch * batch         # training drops the last partial batch
        return predict_epoch_time(n, batch, trained, cpu_spec(c, "CPU", workload), link,
                                  "ddp", images_per_second=rate,
                                  overheads=calibrated_overheads(c), workload=workload)

    rows = []
    for b, _ in measured:
        c = calibrate([m for m in measured if m[0] != b])
        rows.append((f"1 process, batch {b}",
                     statistics.fmean(r.sec_per_epoch for r in by_batch[b]),
                     epoch(1, b, c, c.images_per_second)))
    for r in ddp_runs:
        rate = cal.images_per_second * r.extra.get("threads_per_process", 1) / threads
        rows.append((f"DDP, {r.num_devices} gloo processes, batch {r.config['batch_size']}",
                     r.sec_per_epoch, epoch(r.num_devices, r.config["batch_size"], cal, rate)))
    return cal, rows


def link_for(row: PublishedRun) -> Optional[LinkSpec]:
    """The link between a published run's GPUs, as far as its hardware says: none named, None.
    An SXM2 V100 is an NVLink module by its datasheet; RTX 4090s without P2P stage every copy
    through host memory."""
    if row.gpu is None:
        return None
    if row.p2p is False:
        return LINKS["PCIe, no P2P (staged through host)"]
    return LINKS["NVLink 2 (V100)"] if "SXM2" in row.gpu else LINKS["PCIe gen3 x16"]


def workload_for(row: PublishedRun) -> Workload:
    """The chapter's ResNet-18 at the run's image size: convolutions scale with the pixels."""
    k = (row.image_size / 28) ** 2
    return replace(RESNET18, forward_flops=RESNET18.forward_flops * k,
                   input_bytes=int(RESNET18.input_bytes * k))


def row_seconds(row: PublishedRun, spec: DeviceSpec, link: LinkSpec, o: Overheads) -> float:
    """Predicted seconds per epoch of one published line (DataParallel, d2l's loader)."""
    return predict_epoch_time(row.n_gpus, row.batch, NUM_IMAGES, spec, link, "dp",
                              workload=workload_for(row), overheads=o,
                              loader_images_per_s=loader_rate(row.image_size))


def _solve(f: Callable[[float], float], target: float, lo: float, hi: float) -> float:
    """x in [lo, hi] with f(x) = target, for f monotone (bisection; clamps at the ends)."""
    up = f(hi) > f(lo)
    for _ in range(60):
        mid = (lo + hi) / 2
        if (f(mid) < target) == up:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _known(rows: Optional[Sequence[PublishedRun]]) -> list[PublishedRun]:
    return [r for r in (runs() if rows is None else rows) if spec_for_name(r.gpu or "-")]


@dataclass(frozen=True)
class Fit:
    """What the published runs say about the unknowns: (low, mean, high) of each."""
    mfu: dict                     # datasheet name -> (low, mean, high) achieved fraction of peak
    thread_s: tuple               # DataParallel's Python per device and step, seconds
    base: Overheads
    run_mfu: dict                 # published run -> the fraction its own 1-GPU line implies

    def mfu_of(self, spec: DeviceSpec) -> tuple:
        """Its own fit, or, for a GPU no run names (the K80), the range over every fitted GPU."""
        if spec.name in self.mfu:
            return self.mfu[spec.name]
        lows, highs = zip(*[(m[0], m[2]) for m in self.mfu.values()])
        return (min(lows), statistics.mean(m[1] for m in self.mfu.values()), max(highs))

    def overheads(self, spec: DeviceSpec, corner: int = 1, thread: int = 1) -> Overheads:
        """Overheads at a corner of the band: 0 low, 1 mean, 2 high (of mfu, of thread_s)."""
        return replace(self.base, mfu=self.mfu_of(spec)[corner], thread_s=self.thread_s[thread])


def _spread(xs: Sequence[float]) -> tuple:
    return (min(xs), statistics.mean(xs), max(xs))


def fit(rows: Optional[Sequence[PublishedRun]] = None, base: Overheads = Overheads()) -> Fit:
    """Fit the achieved fraction of peak of each GPU to its 1-GPU lines, then DataParallel's
    Python per device to the 2-GPU lines (at their GPU's fitted fraction)."""
    known = _known(rows)
    mfus: dict = {}
    run_mfu = {}
    for r in (r for r in known if r.n_gpus == 1):
        spec = spec_for_name(r.gpu)
        run_mfu[r.run] = _solve(lambda x: row_seconds(r, spec, link_for(r), replace(base, mfu=x)),
                                r.sec_per_epoch, 0.01, 3.0)
        mfus.setdefault(spec.name, []).append(run_mfu[r.run])
    threads = []
    for r in (r for r in known if r.n_gpus > 1 and r.run in run_mfu):
        # at the fraction its own 1-GPU line reached: the same box on the same day
        spec, o = spec_for_name(r.gpu), replace(base, mfu=run_mfu[r.run])
        threads.append(_solve(lambda x: row_seconds(r, spec, link_for(r), replace(o, thread_s=x)),
                              r.sec_per_epoch, 0.0, 0.5))
    return Fit({k: _spread(v) for k, v in mfus.items()},
               _spread(threads) if threads else (base.thread_s,) * 3, base, run_mfu)


@functools.lru_cache(maxsize=1)
def published_fit() -> Fit:
    """`fit` of the whole published table, computed once (every page's prediction asks)."""
    return fit()


def predict_row(row: PublishedRun, f: Fit) -> float:
    """A published line, predicted at the fit's mean; a 2-GPU line at the fraction of peak its
    own 1-GPU line implies, where the fit has that line."""
    spec = spec_for_name(row.gpu)
    o = f.overheads(spec)
    if row.n_gpus > 1 and row.run in f.run_mfu:
        o = replace(o, mfu=f.run_mfu[row.run])
    return row_seconds(row, spec, link_for(row), o)


def held_out(rows: Optional[Sequence[PublishedRun]] = None) -> list[dict]:
    """Leave one out: each published line with a named GPU, predicted by a fit of all the
    others (its own 1-GPU partner included: the fit sees the GPU, never the figure)."""
    known = _known(rows)
    out = []
    for r in known:
        pred = predict_row(r, fit([x for x in known if x is not r]))
        out.append(dict(run=r.run, label=r.label, gpu=r.gpu, n_gpus=r.n_gpus, batch=r.batch,
                        published_s=r.sec_per_epoch, predicted_s=pred,
                        error=(pred - r.sec_per_epoch) / r.sec_per_epoch))
    return out


def directions(rows: Optional[Sequence[PublishedRun]] = None) -> list[dict]:
    """Each published 1 -> 2 GPU comparison with a named GPU, as a reader meets it: given the
    1-GPU line, is 2 GPUs faster? Published speedup t1 / t2 against t1 / the held-out
    prediction of t2 (> 1: two GPUs faster), and whether the two agree in direction."""
    pred = {(h["run"], h["n_gpus"]): h["predicted_s"] for h in held_out(rows)}
    out = []
    for one, two in pairs(list(rows) if rows is not None else None):
        if (two.run, 2) in pred:
            p = one.sec_per_epoch / pred[(two.run, 2)]
            s = one.sec_per_epoch / two.sec_per_epoch
            out.append(dict(run=one.run, gpu=one.gpu, published=s, predicted=p,
                            agree=(p > 1) == (s > 1)))
    return out


def unknown_hardware(f: Optional[Fit] = None, link: LinkSpec = LINKS["PCIe gen3 x16"]
                     ) -> list[dict]:
    """Runs that name no GPU: their 1- and 2-GPU seconds as a range over the GPUs with a
    datasheet here that existed when the run was published (each across its mfu band), and
    the GPUs whose range holds both figures."""
    f = f or fit()
    out = []
    for one, two in pairs():
        if one.gpu is not None:
            continue
        rng = {}
        year = int(one.date[:4]) if one.date else 9999
        for spec in (s for s in DEVICES.values() if (s.released or 0) <= year):
            rng[spec.name] = [sorted(row_seconds(r, spec, link, f.overheads(spec, c))
                                     for c in (0, 2)) for r in (one, two)]
        lo1, hi1 = min(v[0][0] for v in rng.values()), max(v[0][1] for v in rng.values())
        lo2, hi2 = min(v[1][0] for v in rng.values()), max(v[1][1] for v in rng.values())
        fits = [k for k, ((a, b), (c, d)) in rng.items()
                if a <= one.sec_per_epoch <= b and c <= two.sec_per_epoch <= d]
        out.append(dict(run=one.run, published=(one.sec_per_epoch, two.sec_per_epoch),
                        one_gpu=(lo1, hi1), two_gpus=(lo2, hi2), consistent=fits))
    return out


def band(predict: Callable[[Overheads], float], spec: DeviceSpec, f: Optional[Fit] = None
         ) -> tuple:
    """(low, mean, high) of a prediction over the fitted overheads' corners: each GPU's
    mfu range crossed with DataParallel's thread_s range."""
    f = f or fit()
    values = [predict(f.overheads(spec, c, t)) for c in (0, 2) for t in (0, 2)]
    return (min(values), predict(f.overheads(spec)), max(values))


def compare(a: Callable[[Overheads], float], b: Callable[[Overheads], float],
            spec: DeviceSpec, names: tuple = ("A", "B"), f: Optional[Fit] = None) -> str:
    """Which of two predictions (seconds) is smaller at every corner of the band: "A faster",
    "B faster", or, where the answer flips inside the band, `UNDECIDED`."""
    f = f or fit()
    diffs = [a(o) - b(o) for o in
             (f.overheads(spec, c, t) for c in (0, 1, 2) for t in (0, 1, 2))]
    if all(d < 0 for d in diffs):
        return f"{names[0]} faster"
    return f"{names[1]} faster" if all(d > 0 for d in diffs) else UNDECIDED


def epoch_time(n_devices: int, global_batch: int, spec: DeviceSpec, link: LinkSpec,
               strategy: str = "dp", num_images: int = 60000) -> Callable[[Overheads], float]:
    """`overheads -> seconds per epoch` of one setup, the form `band` and `compare` take."""
    return lambda o: predict_epoch_time(n_devices, global_batch, num_images, spec, link,
                                        strategy, overheads=o)
