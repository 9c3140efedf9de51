"""The step-time model held against the published runs of 12.6. From the PyTorch runs that
name their GPU, `fit` takes only what no datasheet gives, per GPU class; the spread of the fits
is each prediction's band."""
from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Sequence

from .flops import resnet18_flops, resnet18_params
from .published import PublishedRun, pairs, runs
from .scaling import (DEVICES, DeviceSpec, LinkSpec, Overheads, Workload,
                      loader_rate, pair_link, predict_epoch_time, spec_for_name)

NUM_IMAGES = 60_000            # Fashion-MNIST's training set: the published runs' epoch
UNDECIDED = "cannot be told from the model"


@functools.lru_cache(maxsize=None)
def workload(width: int = 64, image_size: int = 28) -> Workload:
    """The chapter's ResNet-18 at `width` on `image_size`-px images, as numbers (no net built)."""
    return Workload(params=resnet18_params(width),
                    forward_flops=float(resnet18_flops(width, image_size)),
                    input_bytes=4 * image_size * image_size)


def link_for(row: PublishedRun) -> Optional[LinkSpec]:
    """`scaling.pair_link` for a published run's GPU and its P2P; None: no datasheet here."""
    spec = spec_for_name(row.gpu or "-")
    return None if spec is None else pair_link(spec, row.p2p)


def row_seconds(row: PublishedRun, spec: DeviceSpec, link: LinkSpec, o: Overheads) -> float:
    """Predicted seconds per epoch of one published line (DataParallel, d2l's loader)."""
    return predict_epoch_time(row.n_gpus, row.batch, NUM_IMAGES, spec, link, "dp",
                              workload=workload(64, row.image_size), overheads=o,
                              loader_images_per_s=loader_rate(row.image_size))


def _solve(f: Callable[[float], float], target: float, lo: float, hi: float) -> float:
    """x in [lo, hi] with f(x) = target, for f monotone (bisection; clamps at the ends)."""
    up = f(hi) > f(lo)
    if (f(lo) >= target) == up:
        return lo
    if (f(hi) <= target) == up:
        return hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if (f(mid) < target) == up else (lo, mid)
    return (lo + hi) / 2


def _known(rows: Optional[Sequence[PublishedRun]] = None) -> list[PublishedRun]:
    """The lines the DataParallel model can be held against: PyTorch, a GPU with a datasheet."""
    return [r for r in (runs() if rows is None else rows)
            if r.framework == "pytorch" and spec_for_name(r.gpu or "-")]


@functools.lru_cache(maxsize=None)
def _implied(row: PublishedRun, o: Overheads, name: str, lo: float, hi: float) -> float:
    """The overhead `name` (in [lo, hi], clamped) at which `row` is predicted as published."""
    spec, link = spec_for_name(row.gpu), link_for(row)
    return _solve(lambda x: row_seconds(row, spec, link, replace(o, **{name: x})),
                  row.sec_per_epoch, lo, hi)


def line_efficiency(one: PublishedRun, base: Overheads = Overheads()) -> float:
    """The efficiency vs counted FLOPs a published 1-GPU line implies (its own, not a fit's)."""
    return _implied(one, base, "efficiency", 0.01, 3.0)


def _lenders(bands: dict, spec: Optional[DeviceSpec], by_peak: bool) -> dict:
    """The fitted GPUs a GPU no run names borrows from: with `by_peak`, a TF32 GPU only from
    TF32-fitted ones where any is (an FP32 core's efficiency says nothing of a tensor core's);
    otherwise every fitted GPU (the widest band)."""
    if by_peak and spec is not None and spec.tf32_tflops:
        return {k: v for k, v in bands.items()
                if getattr(DEVICES.get(k), "tf32_tflops", None)} or bands
    return bands


def _own_or_lent(bands: dict, spec: Optional[DeviceSpec], default: float,
                 by_peak: bool = False) -> tuple:
    """`spec`'s own band; for a GPU no run names, from the lowest low to the highest high of
    its lenders (`_lenders`), its middle the mean of their middles (`default`: none fitted)."""
    if spec and spec.name in bands:
        return bands[spec.name]
    lenders = _lenders(bands, spec, by_peak)
    if not lenders:
        return (default,) * 3
    lows, mids, highs = zip(*lenders.values())
    return (min(lows), statistics.mean(mids), max(highs))


@dataclass(frozen=True)
class Fit:
    """What the published runs say about the unknowns, per GPU class: (low, mean, high)."""
    efficiency: dict              # datasheet name -> efficiency vs counted FLOPs
    thread_s: dict                # datasheet name -> DataParallel's Python per device, s
    base: Overheads
    run_efficiency: dict          # published run -> what its own 1-GPU line implies
    counts: dict = field(default_factory=dict)   # datasheet name -> runs fitted

    def efficiency_of(self, spec: Optional[DeviceSpec]) -> tuple:
        """Its own fit, else its lenders' range (a TF32 GPU: the TF32-fitted GPUs'), each
        against its own peak (`basis`)."""
        return _own_or_lent(self.efficiency, spec, self.base.efficiency, by_peak=True)

    def thread_of(self, spec: Optional[DeviceSpec]) -> tuple:
        """DataParallel's Python per device: its own fit, else every fitted GPU's range."""
        return _own_or_lent(self.thread_s, spec, self.base.thread_s)

    def lent(self, spec: Optional[DeviceSpec]) -> bool:
        return spec is None or spec.name not in self.efficiency or spec.name not in self.thread_s

    def basis(self, spec: Optional[DeviceSpec]) -> str:
        """Where `spec`'s band comes from, in words a page can print."""
        lo, _, hi = self.efficiency_of(spec)
        if not self.lent(spec):
            return f"fitted to {self.counts.get(spec.name, 0)} published {spec.name} runs"
        what = spec.name if spec else "this GPU"
        lenders = _lenders(self.efficiency, spec, by_peak=True)
        if lenders is self.efficiency:
            whose = "every fitted GPU"
        else:
            whose = (f"the fitted TF32 GPU{'s' if len(lenders) > 1 else ''}, "
                     + ", ".join(lenders))
        return (f"no published run on {what}: lent the range of {whose} "
                f"({lo:.2f} to {hi:.2f} of peak), so the band is wide")

    def overheads(self, spec: Optional[DeviceSpec], corner: int = 1, thread: int = 1) -> Overheads:
        """Overheads at a corner of the band: 0 low, 1 mean, 2 high (of efficiency, of thread_s)."""
        return replace(self.base, efficiency=self.efficiency_of(spec)[corner],
                       thread_s=self.thread_of(spec)[thread])


def fit(rows: Optional[Sequence[PublishedRun]] = None, base: Overheads = Overheads()) -> Fit:
    """Per GPU class, its own band: the efficiency of its 1-GPU lines, then DataParallel's
    Python per device of its 2-GPU lines, each at the efficiency its own 1-GPU line implies."""
    known = _known(rows)
    run_eff = {r.run: line_efficiency(r, base) for r in known if r.n_gpus == 1}
    effs: dict = {}
    threads: dict = {}
    for r in known:
        name = spec_for_name(r.gpu).name
        if r.n_gpus == 1:
            effs.setdefault(name, []).append(run_eff[r.run])
        elif r.run in run_eff:   # thread_s at the efficiency its own 1-GPU line implies
            threads.setdefault(name, []).append(
                _implied(r, replace(base, efficiency=run_eff[r.run]), "thread_s", 0.0, 0.5))
    eff_bands, thread_bands = ({k: (min(v), statistics.mean(v), max(v)) for k, v in d.items()}
                               for d in (effs, threads))
    return Fit(eff_bands, thread_bands, base, run_eff, {k: len(v) for k, v in effs.items()})


@functools.lru_cache(maxsize=1)
def published_fit() -> Fit:
    """`fit` of the whole published table, computed once (every page's prediction asks)."""
    return fit()


def held_out(rows: Optional[Sequence[PublishedRun]] = None) -> list[dict]:
    """Leave one out: each published line with a named GPU, predicted at the mean of a fit of
    all the others; a 2-GPU line at the efficiency its own 1-GPU line implies, where it can."""
    known = _known(rows)
    out = []
    for r in known:
        f, spec = fit([x for x in known if x is not r]), spec_for_name(r.gpu)
        o = f.overheads(spec)
        if r.n_gpus > 1 and r.run in f.run_efficiency:
            o = replace(o, efficiency=f.run_efficiency[r.run])
        pred = row_seconds(r, spec, link_for(r), o)
        out.append(dict(run=r.run, label=r.label, gpu=r.gpu, n_gpus=r.n_gpus, batch=r.batch,
                        published_s=r.sec_per_epoch, predicted_s=pred,
                        error=(pred - r.sec_per_epoch) / r.sec_per_epoch))
    return out


def _conditioned(one: PublishedRun, two: PublishedRun, f: Fit) -> tuple:
    """(low, mean, high) of a 2-GPU line given its own 1-GPU line: that line's efficiency,
    across `f`'s band of DataParallel's Python for the GPU."""
    spec = spec_for_name(two.gpu)
    o = replace(f.base, efficiency=line_efficiency(one, f.base))
    return tuple(row_seconds(two, spec, link_for(two), replace(o, thread_s=t))
                 for t in f.thread_of(spec))


def conditioned_errors(gpu: str = "V100 SXM2") -> list[dict]:
    """Leave one build out, for every published comparison on `gpu` (a `DEVICES` key): fit the
    others, then predict its 2-GPU line from its own 1-GPU line (`_conditioned`); a row each."""
    known = _known()
    out = []
    for one, two in (p for p in pairs(known) if spec_for_name(p[0].gpu).name == gpu):
        lo, mid, hi = _conditioned(one, two, fit([r for r in known if r.run != one.run]))
        out.append(dict(run=one.run, repo=one.repo, date=one.date, one_s=one.sec_per_epoch,
                        published_s=two.sec_per_epoch, predicted_s=mid, low_s=lo, high_s=hi,
                        error=(mid - two.sec_per_epoch) / two.sec_per_epoch))
    return out


def ratio_errors(gpu: str = "V100 SXM2") -> list[dict]:
    """The model-free baseline beside `conditioned_errors`: each build's 2-GPU line predicted
    as the other builds' mean ratio (2-GPU over 1-GPU seconds) times its own 1-GPU line."""
    known = [p for p in pairs(_known()) if spec_for_name(p[0].gpu).name == gpu]
    out = []
    for one, two in known:
        ratio = statistics.mean(t.sec_per_epoch / o.sec_per_epoch
                                for o, t in known if o.run != one.run)
        pred = ratio * one.sec_per_epoch
        out.append(dict(run=one.run, ratio=ratio, predicted_s=pred,
                        published_s=two.sec_per_epoch,
                        error=(pred - two.sec_per_epoch) / two.sec_per_epoch))
    return out


def held_out_sources() -> list[dict]:
    """Leave one source out: each line of a repository predicted by a fit of the others (a
    2-GPU line from its own 1-GPU line), and whether the published figure is inside the band."""
    known = _known()
    out = []
    for repo in dict.fromkeys(r.repo for r in known):
        f = fit([r for r in known if r.repo != repo])
        for one, two in pairs([r for r in known if r.repo == repo]):
            spec = spec_for_name(one.gpu)
            b1 = band(lambda o: row_seconds(one, spec, link_for(one), o), spec, f)
            for r, (lo, mid, hi) in ((one, b1), (two, _conditioned(one, two, f))):
                out.append(dict(repo=repo, run=r.run, gpu=spec.name, n_gpus=r.n_gpus,
                                published_s=r.sec_per_epoch, predicted_s=mid, low_s=lo,
                                high_s=hi, inside=lo <= r.sec_per_epoch <= hi,
                                error=(mid - r.sec_per_epoch) / r.sec_per_epoch))
    return out


def directions() -> list[dict]:
    """Each published 1 -> 2 GPU comparison with a named GPU: the published speedup t1 / t2,
    t1 over the held-out prediction of t2, and whether they agree (both > 1 or both not)."""
    known = _known()
    pred = {(h["run"], h["n_gpus"]): h["predicted_s"] for h in held_out(known)}
    out = []
    for one, two in pairs(known):
        p, s = one.sec_per_epoch / pred[(two.run, 2)], one.sec_per_epoch / two.sec_per_epoch
        out.append(dict(run=one.run, gpu=one.gpu, published=s, predicted=p,
                        agree=(p > 1) == (s > 1)))
    return out


CORNERS = ((0, 0), (0, 2), (2, 0), (2, 2), (1, 1))   # (efficiency, thread_s): low/mean/high


def band(predict: Callable[[Overheads], float], spec: DeviceSpec, f: Optional[Fit] = None
         ) -> tuple:
    """(low, mean, high) of a prediction over the fitted overheads' corners: the GPU's
    efficiency range crossed with its DataParallel thread_s range."""
    f = f or published_fit()
    values = [float(predict(f.overheads(spec, c, t))) for c, t in CORNERS[:4]]
    return (min(values), float(predict(f.overheads(spec))), max(values))


def corner_gaps(a: Callable[[Overheads], float], b: Callable[[Overheads], float],
                spec: DeviceSpec, f: Optional[Fit] = None) -> list[float]:
    """`a - b` in seconds at each of the fit's 4 corners, then at its middle (`CORNERS`)."""
    f = f or published_fit()
    return [float(a(o)) - float(b(o)) for o in (f.overheads(spec, c, t) for c, t in CORNERS)]


def predicted_faster(a: Callable[[Overheads], float], b: Callable[[Overheads], float],
                     spec: DeviceSpec, names: tuple = ("A", "B"), f: Optional[Fit] = None) -> str:
    """Which of two predictions (seconds) of the same fit is smaller, paired: "A faster" only
    where A is smaller at every corner of the fit (and its middle), "B faster" the other way
    round, else `UNDECIDED`. (Two bands of one fit move together: they may overlap where one
    setup wins at every corner.) A prediction, not a verdict: no measurement is tested."""
    gaps = corner_gaps(a, b, spec, f)
    if all(d < 0 for d in gaps):
        return f"{names[0]} faster"
    return f"{names[1]} faster" if all(d > 0 for d in gaps) else UNDECIDED


def epoch_time(n_devices: int, global_batch: int, spec: DeviceSpec,
               link: Optional[LinkSpec] = None, strategy: str = "dp"
               ) -> Callable[[Overheads], float]:
    """`overheads -> seconds per epoch` of one setup, for `band` and `predicted_faster`; the link
    defaults to `scaling.pair_link`."""
    link = link or pair_link(spec)
    return lambda o: predict_epoch_time(n_devices, global_batch, NUM_IMAGES, spec, link,
                                        strategy, overheads=o)
