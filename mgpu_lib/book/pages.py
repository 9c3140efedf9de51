"""What each page of the book trains, how long that should take, and how to fit it in a budget.

Every notebook's setup cell calls `setup_page(<its name>)`: it picks the profile, predicts the
page's run time (`perf.runtime`: a range, from the fitted overheads on a GPU, from the recorded
CPUs on a CPU; autocast left out, so with tensor cores it errs long; plus `STARTUP_S`), and
`trim`s a page longer than the budget (`BUDGET_MIN` minutes; `MGPU_PAGE_BUDGET_MIN` sets
another, 0 = no limit). It returns the lines the cell prints, cuts included."""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, Sequence

import torch

from ..devices import num_gpus
from .profiles import Profile, active_profile, banner, get_profile
from .store import check_writable, plural, read, recorded
from ..perf.runtime import Job, cpu_rates, cpu_seconds, gpu_band, gpu_seconds
from ..perf.scaling import spec_for_name
from .style import book_style
from .flags import Check
from ..training import TrainConfig

BUDGET_MIN = 15.0
# a week at most: a longer page budget is a typo, not a plan
BUDGET = Check("a number of minutes from 0 (no limit) to 10,080 (a week)",
               lambda v: 0 <= v <= 7 * 24 * 60, float)
STARTUP_S = 20.0
FULL_TRAIN, FULL_TEST = 60_000, 10_000
MIN_TRAIN = 5_000           # trimming never goes below this many training images


@dataclass(frozen=True)
class Ex1Plan:
    """Exercise 1's sweeps under a profile: the base config, the values, and the stores.
    `store` is where the page reads its points (under `cpu` a shipped record, `recorded`, never
    written); new points go to `runs` in `./runs/`, never inside the package."""
    base: TrainConfig
    epochs: list
    batches: list
    lrs: list
    store: Path
    recorded: bool              # the store is a record shipped with the package
    seeds: tuple
    runs: Path


def recorded_cpu_rates() -> dict[str, dict[int, float]]:
    """`runtime.cpu_rates` of the CPUs whose benchmarks ship with the book (`bench_cpu.jsonl`)."""
    return cpu_rates(read(recorded("bench_cpu.jsonl")))


def predict_jobs(jobs: Sequence[Job], gpu_name: Optional[str] = None
                 ) -> Optional[tuple[float, float, str]]:
    """(low, high, on what): the seconds `jobs` take on GPUs named `gpu_name` (the fitted band),
    or without one on the recorded 2-core CPUs (slowest, fastest); None: no datasheet or record."""
    if gpu_name:
        spec = spec_for_name(gpu_name)
        if spec is None:
            return None
        return (*gpu_band(jobs, spec), spec.name)
    rates = recorded_cpu_rates()
    if not rates:
        return None
    times = [cpu_seconds(jobs, r) for r in rates.values()]
    return min(times), max(times), f"a 2-core CPU like the {plural(len(rates), 'recorded one')}"


def ex1_plan(profile: Profile, *, fresh: bool = True) -> Ex1Plan:
    """smoke: a tiny sweep, trained afresh (`fresh`: its store is emptied); cpu: the recorded
    sweep (width 16, 5,000 images), read, not retrained; else the chapter's settings."""
    runs = Path("runs") / f"ex1_{profile.name.replace(', ', '_').replace(' ', '_')}.jsonl"
    if profile.name == "smoke":
        if fresh:   # one file, replaced by each run: a temporary folder outlives a killed kernel
            check_writable(runs, store=True, kind="run")   # a folder, or not ex1's: refused
            runs.unlink(missing_ok=True)
        base = profile.config(num_epochs=2, train_limit=500, test_limit=200)
        return Ex1Plan(base, [1, 2], [32, 64], [0.05, 50.0], runs, False, profile.seeds, runs)
    lrs = [0.05, 0.1, 0.2, 0.4, 50.0]
    if profile.name == "cpu":
        return Ex1Plan(profile.config(train_limit=5000, test_limit=1000), [1, 2, 3, 4, 5, 6],
                       [128, 256, 512], lrs, recorded("ex1_cpu.jsonl"), True, profile.seeds, runs)
    e = profile.num_epochs
    epochs = sorted({max(1, e // 5), max(1, e // 2), e, 2 * e})
    return Ex1Plan(profile.config(), epochs, [128, 256, 512, 1024], lrs, runs, False,
                   profile.seeds, runs)


def _run(what: str, p: Profile | TrainConfig, runs: int = 1, batch: Optional[int] = None,
         epochs: Optional[int] = None) -> Job:
    return Job(what, runs, p.width, batch or p.batch_size, epochs or p.num_epochs,
               p.train_limit or FULL_TRAIN, p.test_limit or FULL_TEST)


def page_jobs(page: str, profile: Profile, gpus: int = 0) -> list[Job]:
    """The training `page` does under `profile` on a machine with `gpus` GPUs."""
    p = profile
    if page == "03_dataparallel":
        jobs = [_run("one run, one device", p)]
        if gpus > 1:
            jobs.append(replace(_run("one run, all GPUs", p, batch=p.batch_size * gpus),
                                devices=gpus))
        return jobs
    if page == "05_ddp":          # at most 3 epochs each; the trace: 3 variants x 4 steps
        epochs, most = min(3, p.num_epochs), max(ddp_process_counts(p.batch_size, gpus))
        return [_run("DataParallel", p, epochs=epochs),
                _run(f"DDP, {most} process{'es' if most > 1 else ''}", p, epochs=epochs),
                Job("the trace, 3 variants", 3, p.width, p.batch_size, steps=4)]
    if page == "06_performance":
        modes = 7 if gpus else 6         # at most: `bench.ablation_modes` with native bf16
        return [Job("the chapter's loop, then each switch", modes, p.width, p.batch_size,
                    steps=2 + 3 * bench_steps(p))]
    if page == "ex1_hyperparameters":
        plan = ex1_plan(p, fresh=False)         # a prediction deletes nothing
        if plan.recorded:
            return []
        b, s = plan.base, len(p.seeds)
        jobs = [_run("epochs sweep (longest run per seed)", b, s, epochs=max(plan.epochs)),
                *[_run(f"batch {x}", b, s, batch=x) for x in plan.batches if x != b.batch_size],
                *[_run(f"lr {x}", b, s) for x in plan.lrs],       # includes the base point
                _run("warmup at 4 x batch, with and without", b, 2 * s, batch=4 * b.batch_size)]
        if gpus >= 2:
            jobs.append(_run("devices sweep", b, s * len([k for k in (2, 4, 8, 16) if k <= gpus])))
        elif gpus == 0:
            jobs.append(_run("DDP, 2 gloo processes", b))
        return jobs
    if page == "ex2_cpu_gpu_split":
        return [Job("speeds, splits and pipelines", 1, p.width, p.batch_size, steps=100)]
    return []


PAGES = ("01_network", "02_devices", "03_dataparallel", "04_summary", "05_ddp",
         "06_performance", "07_accuracy_drop", "08_time_model", "09_verdicts",
         "ex1_hyperparameters", "ex2_cpu_gpu_split")


def ddp_process_counts(global_batch: int, gpus: int) -> list[int]:
    """1 process, and the most (up to the GPUs, or 2 gloo processes without one) that split
    the batch evenly; page 05 runs DDP with the most."""
    most = max(k for k in range(1, (gpus or 2) + 1) if global_batch % k == 0)
    return sorted({1, most})


def bench_steps(p: Profile) -> int:
    """Timed steps per round of the Performance page's benchmarks."""
    return {"smoke": 3, "cpu": 5}.get(p.name, 20)


def trim(page: str, profile: Profile, seconds, budget_s: float,
         gpus: int = 0) -> tuple[Profile, list[str]]:
    """`profile` and one phrase per cut, cut until `seconds(page_jobs(...))` fits `budget_s`:
    one seed, then half the images down to `MIN_TRAIN`, then half the epochs down to 2."""
    p, cuts = profile, []

    def cost(q):
        return STARTUP_S + seconds(page_jobs(page, q, gpus))
    if budget_s <= 0 or cost(p) <= budget_s:
        return p, cuts
    if len(p.seeds) > 1 and cost(p.replace(seeds=p.seeds[:1])) < cost(p):
        cuts.append(f"1 of {len(p.seeds)} seeds")
        p = p.replace(seeds=p.seeds[:1])
    train = p.train_limit or FULL_TRAIN
    while cost(p) > budget_s and train // 2 >= MIN_TRAIN:
        train //= 2
        p = p.replace(train_limit=train,
                      test_limit=min(p.test_limit or FULL_TEST, max(2000, train // 6)))
    if train != (profile.train_limit or FULL_TRAIN):
        cuts.append(f"{train:,} of {profile.train_limit or FULL_TRAIN:,} training images, "
                    f"{p.test_limit:,} of {profile.test_limit or FULL_TEST:,} test images")
    while cost(p) > budget_s and p.num_epochs // 2 >= 2:
        p = p.replace(num_epochs=p.num_epochs // 2)
    if p.num_epochs != profile.num_epochs:
        cuts.append(f"{p.num_epochs} of {profile.num_epochs} epochs")
    return p.replace(name=f"{profile.name}, trimmed"), cuts


def budget_s() -> float:
    """The page budget in seconds: `MGPU_PAGE_BUDGET_MIN` minutes (0: no limit), else 15."""
    text = os.environ.get("MGPU_PAGE_BUDGET_MIN", "").strip()
    try:
        return 60 * (BUDGET.parse(text) if text else BUDGET_MIN)
    except ValueError as e:
        raise ValueError(f"MGPU_PAGE_BUDGET_MIN {e}") from None


def minutes(seconds: float) -> str:
    """'under a minute', 'about 4 min', 'about 1.5 h', 'about 3 days', 'over a year'."""
    if seconds < 60:
        return "under a minute"
    if seconds < 90 * 60:
        return f"about {seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"about {seconds / 3600:.1f} h"
    if seconds < 365 * 86400:
        return f"about {seconds / 86400:.0f} days"
    return "over a year"


def span(low: float, high: float) -> str:
    """A time range in words: 'about 5 to 17 min', or one figure where both round alike."""
    lo, hi = minutes(low), minutes(high)
    if lo == hi:
        return hi
    if low >= 60 and hi.endswith(" min"):
        return f"about {low / 60:.0f} to {high / 60:.0f} min"
    return f"{lo} to {hi.replace('about ', '')}"


def predict(page: str, profile: Profile, gpu_name: Optional[str] = None,
            gpus: int = 0, budget: Optional[float] = None) -> dict:
    """The predicted run time of `page` under `profile` on `gpu_name` (a CUDA device name), else
    on the recorded CPUs. Keys: `seconds` ((low, high); None: no datasheet), `profile` (on a
    GPU trimmed to `budget` seconds, default `budget_s()`), `cuts`, `on`, `budget_s`."""
    budget = budget_s() if budget is None else budget
    pred = dict(seconds=None, profile=profile, cuts=[], on=gpu_name or "this CPU", budget_s=budget)
    spec = spec_for_name(gpu_name) if gpu_name else None
    if spec is not None:
        gpus, name = gpus or 1, spec.name.split()[0]
        p, cuts = trim(page, profile, lambda jobs: gpu_seconds(jobs, spec), budget, gpus)
        lo, hi, _ = predict_jobs(page_jobs(page, p, gpus), gpu_name)
        pred.update(seconds=(STARTUP_S + lo, STARTUP_S + hi), profile=p, cuts=cuts,
                    on=f"{gpus} x {name}" if gpus > 1 else f"one {name}")
    elif not gpu_name and (band := predict_jobs(page_jobs(page, profile))) is not None:
        pred.update(seconds=(STARTUP_S + band[0], STARTUP_S + band[1]), on=band[2])
    return pred


def expected_line(pred: dict) -> str:
    """One line: the page's expected time, labelled a prediction, with any cuts."""
    if pred["seconds"] is None:
        return f"expected: no prediction ({pred['on'][:32]} has no datasheet here)"
    line = f"expected: {span(*pred['seconds'])} on {pred['on']} (predicted)"
    if pred["cuts"]:
        line += (f"\ntrimmed to fit {pred['budget_s'] / 60:,g} min:"
                 + "".join(f"\n  {c}" for c in pred["cuts"]))
    return line


def setup_page(page: str) -> tuple[Profile, str]:
    """For a notebook's setup cell: set the figure style; the profile (trimmed on a GPU) and
    the lines to print (banner, expected time)."""
    book_style()
    profile = active_profile()
    try:                 # the same on every machine: a bad budget warns and keeps the default
        budget = budget_s()
    except ValueError as e:
        warnings.warn(f"{e}; using {BUDGET_MIN:g} min", stacklevel=2)
        budget = 60 * BUDGET_MIN
    gpus = num_gpus()
    pred = predict(page, profile, torch.cuda.get_device_name(0) if gpus else None, gpus, budget)
    return pred["profile"], banner(pred["profile"]) + "\n" + expected_line(pred)


def prediction_table() -> list[str]:
    """The README's table, in Markdown lines: each page's predicted time range on a Colab T4
    under `full` (as written, and trimmed to `budget_s()`, which the header names) and on the
    recorded 2-core CPUs under `cpu`."""
    budget, full, cpu = budget_s(), get_profile("full"), get_profile("cpu")
    cut = f"cut to fit {budget / 60:,g} min" if budget > 0 else "cuts (no budget)"
    lines = [f"| page | T4, `full` as written | T4, `full` as run | {cut} | 2-core CPU, `cpu` |",
             "|---|---|---|---|---|"]
    for page in PAGES:
        as_is = predict(page, full, "Tesla T4", 1, budget)     # the header's budget
        untrimmed = [STARTUP_S + t for t in predict_jobs(page_jobs(page, full, 1), "T4")[:2]]
        row = (page, span(*untrimmed), span(*as_is["seconds"]),
               "; ".join(as_is["cuts"]) or "none", span(*predict(page, cpu)["seconds"]))
        lines.append("| " + " | ".join(row) + " |")
    return lines
