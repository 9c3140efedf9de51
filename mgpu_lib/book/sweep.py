"""Resumable hyperparameter sweeps, stored as JSON Lines: every finished point survives.

`sweep` trains `vary` x `seeds`, appending each point's record to the store under a file lock:
two sweeps may share a store, a crash loses at most the point in flight, and a rerun skips every
point stored (keyed by the full config and options) or in a read-only `recorded` store. A failed
point (a DDP rank died) is stored as "failed"; a rerun tries it again.

`train` has no lr schedule and the shuffle and weights depend only on the seed, so the first k
epochs of a longer run *are* a k-epoch run: such a point is derived by truncation, not trained
(its record says `derived_from`)."""
from __future__ import annotations

import functools
import itertools
import json
import math
import time
from dataclasses import fields, replace
from typing import Callable, Optional, Sequence

import torch

from . import store as results
from .store import plural
from .pages import FULL_TEST, FULL_TRAIN, predict_jobs
from ..config import Switches
from .flags import COUNT, NONNEGATIVE_NUMBER, SEED, on_cli, read_setting
from ..ddp import choose_backend, flag_name, local_batch_size
from ..devices import DeviceError, num_gpus, resolve_devices
from ..lab.bench import check_fits
from ..lab.d2l import chapter_data
from ..lab.drop import bn_readings
from ..lab.launcher import LaunchError, check_nprocs, launch
from ..perf.runtime import Job
from ..training import BN_METRICS, METRICS, TrainConfig, TrainResult, train

# Sweep axes that are not TrainConfig fields, with their checks: a linear lr warmup (epochs),
# and DDP processes through `ddp.launch` (0 = the DataParallel `train`).
OPTIONS = {"warmup_epochs": NONNEGATIVE_NUMBER, "nprocs": COUNT}
# config fields that only choose the fast path's switches (the chapter's loop ignores them)
SWITCH_FIELDS = ("fast",) + tuple(f.name for f in fields(Switches))
# The settings that change a run's cost in the model; every other key only multiplies runs.
SHAPE = ("batch_size", "width", "train_limit", "test_limit", "devices")


# ---- the points ------------------------------------------------------------------------------

def point_key(config, options: Optional[dict] = None) -> str:
    """A stable string for a point (a TrainConfig or its dict): the config fields that differ
    from TrainConfig's defaults (so a field added later keeps stored keys), non-zero options."""
    d = config.to_dict() if isinstance(config, TrainConfig) else config
    defaults = TrainConfig().to_dict()
    ignored = SWITCH_FIELDS[1:] if d.get("fast") is False else ()   # the chapter's loop
    cfg = {k: v for k, v in d.items() if k in defaults and v != defaults[k] and k not in ignored}
    if "lr" in cfg:                 # lr 1 and lr 1.0 are one point (JSON writes "1" vs "1.0")
        cfg["lr"] = float(cfg["lr"])
    opts = {k: float(v) for k, v in (options or {}).items() if v}
    return json.dumps({"config": cfg, "options": opts}, sort_keys=True)


def key_of(record: TrainResult) -> str:
    """A record's point key: computed, never stored (it follows TrainConfig's defaults)."""
    return point_key(record.config, record.extra.get("options"))


def as_point(result: TrainResult, config: TrainConfig, options: dict) -> TrainResult:
    """`result` as the sweep point (config, options in `extra`)."""
    return replace(result, config=config.to_dict(), extra={**result.extra, "options": options})


def load_store(path) -> list[TrainResult]:
    """A store's runs ([] if there is no file yet); of a point stored twice, the later record."""
    runs = [results.as_run(d, f"{path}: record {i}")
            for i, d in enumerate(results.read(path), 1)]
    return list({key_of(r): r for r in runs}.values())


# ---- the axes --------------------------------------------------------------------------------

def unique(values: Sequence) -> list:
    """`values` once each, in order (by ==: lr 1 is lr 1.0)."""
    return list(dict.fromkeys(values))


def parse_seeds(text: str) -> list[int]:
    """'0-3,7' -> [0, 1, 2, 3, 7]; a ValueError for a seed that is no seed."""
    seeds = []
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        seeds += range(SEED.parse(lo or part), SEED.parse(hi if dash else lo) + 1)
    return seeds


def vary_keys(config=TrainConfig) -> dict[str, Callable[[str], object]]:
    """Every --vary key and how its text is read: the config's flags (seeds have --seeds), each
    as its flag reads it (the config checks the range), and the options, by their checks."""
    return ({f.name: functools.partial(read_setting, f) for f in on_cli(config)
             if f.name != "seed"} | {k: check.parse for k, check in OPTIONS.items()})


def parse_vary(text: str, config=TrainConfig) -> tuple:
    """`lr=0.05,0.1` -> ("lr", [0.05, 0.1]), each value by the key's check; a key may be a
    field's name or its flag's (`epochs`, `batch-size`). A ValueError says what is wrong."""
    keys = vary_keys(config)
    aliases = {flag_name(f)[2:].replace("-", "_"): f.name for f in on_cli(config)}
    name, sep, values = text.partition("=")
    name = aliases.get(name.strip().replace("-", "_"), name.strip().replace("-", "_"))
    if name not in keys:
        raise ValueError(f"unknown key {name!r}; known keys: {', '.join(keys)}")
    if not sep or not values:
        raise ValueError(f"expected NAME=V1,V2,..., got {text!r}")
    try:
        return name, [keys[name](v) for v in values.split(",")]
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def merge_vary(pairs) -> dict:
    """A repeated key adds its values (`--vary lr=0.05 --vary lr=0.1` sweeps both); a value
    given twice is swept once."""
    vary: dict = {}
    for name, values in pairs:
        vary.setdefault(name, []).extend(values)
    return {name: unique(values) for name, values in vary.items()}


def count_points(vary: dict, seeds: Sequence[int]) -> int:
    """How many points `vary` x `seeds` has (each value once), without building them."""
    return math.prod(len(unique(v)) for v in vary.values()) * len(unique(seeds))


def expand(base: TrainConfig, vary: dict, seeds: Sequence[int]) -> list[tuple[TrainConfig, dict]]:
    """The cartesian product of `vary` and `seeds`, each value once, longest runs first (so
    short ones derive); each key a config field (not the seed) or an option."""
    points = []
    for values in itertools.product(*(unique(v) for v in vary.values()), unique(seeds)):
        chosen = dict(zip(vary, values[:-1]))
        options = {k: chosen.pop(k) for k in list(chosen) if k in OPTIONS}
        points.append((base.replace(**chosen, seed=values[-1]), options))
    return sorted(points, key=lambda p: -p[0].num_epochs)


def check_point(config: TrainConfig, options: dict) -> None:
    """A ValueError or DeviceError, naming the point, if it cannot train here."""
    nprocs = options.get("nprocs", 0)
    try:
        if nprocs and options.get("warmup_epochs"):
            raise ValueError("warmup with DDP processes is not implemented; vary one of them")
        if nprocs:
            local_batch_size(config.batch_size, nprocs)
            check_nprocs(nprocs, choose_backend())       # the launcher's own refusal
        else:
            resolve_devices(config.devices)
        check_fits(config.width, config.batch_size, config.devices)   # before allocating
    except (ValueError, DeviceError) as e:
        raise type(e)(f"{describe_point(config, options)}: {e}") from None


# ---- the plan --------------------------------------------------------------------------------

def sweep_jobs(base: TrainConfig, vary: dict, seeds: Sequence[int]) -> list[Job]:
    """What `sweep(base, vary, seeds)` trains, as `runtime` jobs (the longest epochs only)."""
    runs = count_points({k: v for k, v in vary.items() if k not in (*SHAPE, "num_epochs")}, seeds)
    epochs = max(vary.get("num_epochs", [base.num_epochs]))
    return [Job("sweep", runs, width, batch, epochs, train or FULL_TRAIN, test or FULL_TEST,
                devices=devices or max(1, num_gpus()))
            for batch, width, train, test, devices in itertools.product(
                *(unique(vary.get(k, [getattr(base, k)])) for k in SHAPE))]


def predicted_sweep(base: TrainConfig, vary: dict, seeds: Sequence[int]
                    ) -> Optional[tuple[float, float, str]]:
    """(low, high, on what) by `pages.predict_jobs` on this machine's first GPU, else the
    recorded CPUs; an upper bound. None without a datasheet or record."""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return predict_jobs(sweep_jobs(base, vary, seeds), gpu)


# ---- the sweep -------------------------------------------------------------------------------

def default_train(config: TrainConfig, warmup_epochs: float = 0.0, nprocs: int = 0) -> TrainResult:
    """`train` without output, with a linear lr warmup, or DDP over `nprocs` processes (a job
    that fails is a result with status "failed" and the error in `extra`; warmup with DDP is
    refused by `check_point`)."""
    if nprocs:
        try:
            return launch(config, nprocs)
        except LaunchError as e:
            return TrainResult(config.to_dict(), hardware=f"DDP, {nprocs} processes",
                               num_devices=nprocs, data_source="unknown", steps_per_epoch=0,
                               status="failed", extra={"error": str(e)})
    data = None if config.fast else chapter_data(config)     # the chapter's loop: its loader
    if warmup_epochs:
        return train_warmup(config, warmup_epochs, data=data)
    return train(config, data=data, progress=False, readings=bn_readings)


def sweep(base: TrainConfig, vary: dict, *, seeds: Sequence[int] = (0, 1, 2), store,
          recorded=None, train_fn: Optional[Callable[..., TrainResult]] = None,
          log: Callable[[str], None] = lambda line: None) -> list[TrainResult]:
    """Train each point of `vary` (TrainConfig fields, `warmup_epochs`, `nprocs`) x `seeds` in
    neither `store` nor `recorded` (only read) by `train_fn(config, **options)` (default
    `default_train`) and append it to `store`; `log` a line per point; return every record."""
    points = expand(base, vary, seeds)
    records = [r for r in (load_store(recorded) if recorded else []) + load_store(store)
               if r.status != "failed"]
    by_key = {key_of(r): r for r in records}
    new = [p for p in points if point_key(*p) not in by_key]
    for config, options in new:         # before anything trains: every point can train here
        if _derive(records, config, options) is None:
            check_point(config, options)
    if new:                             # the store is checked, and written, only if one is new
        results.check_writable(store, store=True, kind="run")
    out = []
    for config, options in points:
        key = point_key(config, options)
        rec = by_key.get(key) or _derive(records, config, options)
        action = "stored" if key in by_key else "derived" if rec else "trained"
        if rec is None:
            t0 = time.perf_counter()
            rec = as_point((train_fn or default_train)(config, **options), config, options)
            rec.extra.setdefault("wall_seconds", round(time.perf_counter() - t0, 2))
        if key not in by_key:
            results.append(store, rec.to_dict())
            if rec.status != "failed":
                records.append(rec)
                by_key[key] = rec
        out.append(rec)
        log(f"{action:7s} {describe_point(config, options)}: {rec.status}, "
            f"test acc {rec.final_test_acc:.3f}, {rec.sec_per_epoch:.1f} s/epoch")
    return out


def _derive(records: Sequence[TrainResult], config: TrainConfig, options: dict
            ) -> Optional[TrainResult]:
    """The point cut from a longer run in `records` that differs only in epochs, else None."""
    k = config.num_epochs
    want = point_key({**config.to_dict(), "num_epochs": 0}, options)    # the length blanked
    for r in records:
        if r.config["num_epochs"] <= k or "derived_from" in r.extra or \
                point_key({**r.config, "num_epochs": 0}, r.extra.get("options")) != want or \
                (r.status == "ok" and len(r.test_acc) < k):
            continue
        diverged = r.status != "ok" and len(r.train_loss) <= k
        # keep the first k epochs; a later divergence did not happen yet
        cut = {} if diverged else {m: list(getattr(r, m))[:k] for m in METRICS + BN_METRICS}
        point = as_point(r, config, options)
        return replace(point, **cut, extra={**point.extra, "derived_from": key_of(r)},
                       status=r.status if diverged else "ok")
    return None


def describe_point(config: TrainConfig, options: dict) -> str:
    return (f"batch {config.batch_size}, lr {config.lr:g}, {plural(config.num_epochs, 'epoch')}, "
            f"seed {config.seed}" + "".join(f", {k} {v:g}" for k, v in options.items() if v))


# --- Learning-rate scaling and warmup (pure arithmetic) --------------------------------------

def linear_scaled_lr(base_lr: float, base_batch: int, batch: int) -> float:
    """Goyal et al. (2017): multiply the lr by k when the global batch grows k-fold. Rounded to
    12 digits so that 0.1 x 4 is 0.4 and finds the stored point (0.1 * 512 / 128 is not 0.4)."""
    return round(base_lr * batch / base_batch, 12)


def warmup_lr(step: int, lr: float, warmup_steps: int) -> float:
    """The lr of optimizer step `step` (from 0): (step + 1) / warmup_steps of `lr`, then `lr`."""
    return lr * (1.0 if warmup_steps <= 0 or step >= warmup_steps else (step + 1) / warmup_steps)


def warmup_sgd(params, lr: float, warmup_steps: int) -> torch.optim.SGD:
    """Plain SGD whose lr follows `warmup_lr`: a `LambdaLR` advanced by a step hook, so the
    epoch loop needs no scheduler call."""
    optimizer = torch.optim.SGD(params, lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_lr(step, 1.0, warmup_steps))
    optimizer.register_step_post_hook(lambda *_: schedule.step())
    return optimizer


def train_warmup(config: TrainConfig, warmup_epochs: float, *, data=None) -> TrainResult:
    """`train` with SGD's lr warmed up linearly over the first `warmup_epochs` epochs."""
    result = train(config, data=data, progress=False, readings=bn_readings,
                   make_optimizer=lambda params, lr, steps_per_epoch: warmup_sgd(
                       params, lr, warmup_steps=round(warmup_epochs * steps_per_epoch)))
    result.extra["warmup_epochs"] = warmup_epochs
    return result
