"""A sweep's plan, before anything trains: its keys, how many points, how long they should take.

    python -m mgpu_lib sweep --vary lr=0.05,0.1 --seeds 0,1 --store runs/lr.jsonl
    plan: 4 points (lr 2 x seeds 2); predicted about 3 to 9 min on a 2-core CPU like the 2 recorded ...

The time comes from the one run-time predictor (`runtime`), the one that predicts each page: a
band from the fitted overheads on a GPU with a datasheet, the recorded 2-core CPUs' range on a
CPU. Points that differ only in epochs are derived from the longest
run (see `sweep`), so only the longest is counted. Stored points are skipped when the sweep runs,
so the prediction is an upper bound.
"""
from __future__ import annotations

import itertools
import math
from typing import Optional, Sequence

import torch

from ..devices import num_gpus
from .pages import FULL_TEST, FULL_TRAIN, span
from .pages import recorded_cpu_rates
from ..perf.runtime import Job, cpu_seconds, gpu_band, recorded_cpus
from ..perf.scaling import spec_for_name
from ..config import Check, flag_name, on_cli
from .sweep import OPTIONS, count_points
from ..training import TrainConfig

# The settings that change a run's cost in the model; every other key only multiplies runs.
SHAPE = ("batch_size", "width", "train_limit", "test_limit", "devices")
MAX_PREDICTED_JOBS = 2_000      # more distinct run shapes than this: no prediction (it is slow)


def vary_keys(config=TrainConfig) -> dict[str, Check]:
    """Every --vary key and its check: the config's flags (seeds have --seeds) and the sweep
    options."""
    keys = {f.name: f.metadata["check"] for f in on_cli(config) if f.name != "seed"}
    return {**keys, **OPTIONS}


def parse_vary(text: str, config=TrainConfig) -> tuple:
    """`lr=0.05,0.1` -> ("lr", [0.05, 0.1]), each value by the key's check; a key may be a
    field's name or its flag's (`epochs`, `batch-size`). A ValueError says what is wrong."""
    keys = vary_keys(config)
    aliases = {flag_name(f)[2:].replace("-", "_"): f.name for f in on_cli(config)}
    name, sep, values = text.partition("=")
    name = aliases.get(name.strip().replace("-", "_"), name.strip().replace("-", "_"))
    if name in ("seed", "seeds"):
        raise ValueError("seeds are not a --vary key; use --seeds 1,2")
    if name not in keys:
        raise ValueError(f"unknown key {name!r}; known keys: {', '.join(keys)}")
    if not sep or not values:
        raise ValueError(f"expected NAME=V1,V2,..., got {text!r}")
    try:
        return name, [keys[name].parse(v) for v in values.split(",")]
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def merge_vary(pairs) -> dict:
    """A repeated key adds its values: `--vary lr=0.05 --vary lr=0.1` sweeps both; a value
    given twice is swept once (the sweep stores one point for it)."""
    vary: dict = {}
    for name, values in pairs:
        have = vary.setdefault(name, [])
        for v in values:
            if v not in have:
                have.append(v)
    return vary


def sweep_jobs(base: TrainConfig, vary: dict, seeds: Sequence[int]) -> list[Job]:
    """What `sweep(base, vary, seeds)` trains, as `runtime` jobs (the longest epochs only)."""
    runs = len(seeds) * math.prod(len(v) for k, v in vary.items()
                                  if k not in SHAPE and k != "num_epochs")
    epochs = max(vary.get("num_epochs", [base.num_epochs]))
    return [Job("sweep", runs, width, batch, epochs, train or FULL_TRAIN, test or FULL_TEST,
                devices=devices or max(1, num_gpus()))
            for batch, width, train, test, devices in itertools.product(
                *(vary.get(k, [getattr(base, k)]) for k in SHAPE))]


def predict_seconds(jobs: Sequence[Job]) -> Optional[tuple[float, float, str]]:
    """(low, high, on what) for `jobs` on this machine's first GPU, else on the recorded CPUs;
    None where there is no datasheet or record to predict from."""
    if torch.cuda.is_available():
        spec = spec_for_name(torch.cuda.get_device_name(0))
        if spec is None:
            return None
        return (*gpu_band(jobs, spec), spec.name)
    rates = recorded_cpu_rates()
    if not rates:
        return None
    times = [cpu_seconds(jobs, r) for r in rates.values()]
    return min(times), max(times), recorded_cpus(rates)


def predicted_sweep(base: TrainConfig, vary: dict, seeds: Sequence[int]
                    ) -> Optional[tuple[float, float, str]]:
    """`predict_seconds` for what the sweep trains: (low, high, on what), an upper bound (stored
    points are skipped); None without a datasheet or record, or with too many run shapes."""
    shapes = math.prod(len(vary.get(k, [0])) for k in SHAPE)
    return (predict_seconds(sweep_jobs(base, vary, seeds)) if shapes <= MAX_PREDICTED_JOBS
            else None)


def plan_line(base: TrainConfig, vary: dict, seeds: Sequence[int],
              pred: Optional[tuple[float, float, str]] = None) -> str:
    """One line: the points, how they multiply, and their predicted time (a prediction; pass
    `predicted_sweep`'s if it is already at hand)."""
    n = count_points(vary, seeds)
    factors = " x ".join(f"{k} {len(v)}" for k, v in vary.items())
    line = f"plan: {n:,} points ({factors} x seeds {len(seeds)})"
    pred = pred or predicted_sweep(base, vary, seeds)
    if pred is None:
        return line + "; no time prediction here"
    low, high, on = pred
    return line + f"; predicted {span(low, high)} on {on}, at most (stored points are skipped)"
