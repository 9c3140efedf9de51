"""Resumable hyperparameter sweeps, stored as JSON Lines: every finished point survives.

    python -m mgpu_lib sweep --vary lr=0.05,0.1,0.2 --seeds 0,1,2 --store runs/lr.jsonl --profile cpu

`sweep` trains the cartesian product of `vary` x `seeds`. After each point it appends one record
to the store (under a file lock, so two sweeps may share a store), so a crash or Ctrl-C loses at
most the point in flight, and a rerun skips every point already stored (the key is the full
config, seed included, plus any sweep option like warmup). A point whose run failed (a DDP rank
died) is stored with status "failed" and the sweep goes on; a rerun tries it again.

Epoch sweeps are cheap here: `train` has no lr schedule, and the data shuffle and the weights
depend only on the seed, so the first k epochs of a longer run *are* a k-epoch run. A point whose
config differs from a stored (or just-trained) record only by a smaller `num_epochs` is derived
from that record by truncation instead of being trained again (its record says `derived_from`).
"""
from __future__ import annotations

import itertools
import json
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional, Sequence

import torch

from . import store as results
from ..lab.launcher import LaunchError, launch
from ..config import COUNT, NONNEGATIVE_NUMBER
from ..config import SWITCH_FIELDS
from ..training import LEGACY_SCHEMA, METRICS, SCHEMA, TrainConfig, TrainResult, run_problem, train

# Sweep axes that are not TrainConfig fields, with their checks: a linear lr warmup (epochs),
# and DDP processes through `ddp.launch` (0 = the DataParallel `train`).
OPTIONS = {"warmup_epochs": NONNEGATIVE_NUMBER, "nprocs": COUNT}
# Above this many points a sweep is refused before its list is built: 10**7 configs take
# minutes just to construct, and no run of this book's network finishes that many.
MAX_POINTS = 100_000


@dataclass
class Record:
    """One finished sweep point: config (seed included), options, per-epoch metrics, hardware."""
    config: dict
    options: dict
    status: str
    hardware: str
    profile: str
    num_devices: int
    steps_per_epoch: int
    data_source: str
    metrics: dict
    extra: dict = field(default_factory=dict)
    derived_from: Optional[str] = None
    schema: int = SCHEMA            # the rest of the header (record.py), from the run's result
    mgpu_lib: Optional[str] = None
    git: Optional[str] = None
    torch: Optional[str] = None

    @classmethod
    def from_dict(cls, d: dict, where: str = "a sweep record") -> "Record":
        """A record from its JSON; one-line ResultsError if it is not a whole one. A record
        from before the header is schema 1 with its versions unknown."""
        problem = ("not a JSON object" if not isinstance(d, dict) else
                   "its metrics are not a dict" if not isinstance(d.get("metrics"), dict) else
                   run_problem({**d["metrics"], "config": d.get("config"),
                                "status": d.get("status")}))
        try:
            if problem is None:
                return cls(**{"schema": LEGACY_SCHEMA, **d})
        except TypeError as e:
            problem = str(e)
        raise results.ResultsError(f"{where} is not a sweep record ({problem})")

    @property
    def key(self) -> str:
        """Computed, never stored: it follows the current TrainConfig's defaults."""
        return point_key(self.config, self.options)

    @property
    def seed(self) -> int:
        return self.config["seed"]

    @property
    def final_test_acc(self) -> float:
        """record.py's rule, as for a TrainResult: nan unless the run finished ("ok")."""
        return TrainResult(self.config, "", 0, "", 0, test_acc=self.metrics["test_acc"],
                           status=self.status).final_test_acc

    @property
    def sec_per_epoch(self) -> float:
        """record.py's rule, as for a TrainResult: nan for a run with no epochs."""
        return TrainResult(self.config, "", 0, "", 0,
                           epoch_seconds=self.metrics["epoch_seconds"]).sec_per_epoch

    def get(self, name: str):
        """A config field or a sweep option by name (what `plot_sweep(x=...)` reads)."""
        return self.options[name] if name in self.options else self.config[name]

    def to_dict(self) -> dict:
        return asdict(self)


def point_key(config, options: Optional[dict] = None) -> str:
    """A stable string for a point (a TrainConfig or its dict): the config fields that differ
    from TrainConfig's defaults, plus non-zero options. Fields added to TrainConfig later (with
    defaults) therefore leave the keys of stored records unchanged."""
    d = config.to_dict() if isinstance(config, TrainConfig) else config
    defaults = TrainConfig().to_dict()
    ignored = SWITCH_FIELDS[1:] if d.get("fast") is False else ()   # the chapter's loop
    cfg = {k: v for k, v in d.items() if k in defaults and v != defaults[k] and k not in ignored}
    if "lr" in cfg:                 # lr 1 and lr 1.0 are one point (JSON writes "1" vs "1.0")
        cfg["lr"] = float(cfg["lr"])
    opts = {k: float(v) for k, v in (options or {}).items() if v}
    return json.dumps({"config": cfg, "options": opts}, sort_keys=True)


def record_from_result(result: TrainResult, config: TrainConfig, options: dict) -> Record:
    return Record(config=config.to_dict(), options=dict(options),
                  status=result.status, hardware=result.hardware, profile=config.profile,
                  num_devices=result.num_devices, steps_per_epoch=result.steps_per_epoch,
                  data_source=result.data_source,
                  metrics={m: list(getattr(result, m)) for m in METRICS},
                  extra=dict(result.extra), schema=result.schema, mgpu_lib=result.mgpu_lib,
                  git=result.git, torch=result.torch)


def truncate(record: Record, config: TrainConfig, options: dict) -> Optional[Record]:
    """`record` cut to `config.num_epochs` epochs, or None if it is too short to tell."""
    k = config.num_epochs
    if record.status == "ok" and len(record.metrics["test_acc"]) < k:
        return None
    diverged = record.status != "ok" and len(record.metrics["train_loss"]) <= k
    metrics = {m: list(v) for m, v in record.metrics.items()}
    if not diverged:   # keep the first k epochs; a later divergence did not happen yet
        metrics = {m: v[:k] for m, v in metrics.items()}
    return Record(**{**record.to_dict(), "config": config.to_dict(), "metrics": metrics,
                     "status": record.status if diverged else "ok",
                     "derived_from": record.key})


def _longer_key(config: dict, options: dict) -> str:
    """The key with num_epochs blanked: points sharing it differ only in length."""
    return point_key({**config, "num_epochs": 0}, options)


def load_store(path) -> list[Record]:
    """The records in a store ([] if the file does not exist yet); for a point stored twice,
    the later record wins."""
    by_key: dict = {}
    for i, d in enumerate(results.read(path)):
        try:
            rec = Record.from_dict(d, f"{path}: record {i + 1}")
            by_key[rec.key] = rec
        except (TypeError, KeyError, AttributeError) as e:
            raise results.ResultsError(f"{path}: record {i + 1} is not a sweep record "
                                       f"({e})") from None
    return list(by_key.values())


def check_vary(base: TrainConfig, vary: dict) -> None:
    """A ValueError for a key that is not a config field or an option (seeds have their own
    argument)."""
    known = [k for k in base.to_dict() if k != "seed"] + list(OPTIONS)
    for k in vary:
        if k == "seed":
            raise ValueError("vary seeds with `seeds` (--seeds 1,2), not as a key")
        if k not in known:
            raise ValueError(f"unknown key {k!r}; known keys: {', '.join(known)}")


def count_points(vary: dict, seeds: Sequence[int]) -> int:
    """How many points `vary` x `seeds` has, without building them."""
    return math.prod(len(v) for v in vary.values()) * len(seeds)


def expand(base: TrainConfig, vary: dict, seeds: Sequence[int]) -> list[tuple[TrainConfig, dict]]:
    """The cartesian product of `vary` and `seeds`, longest runs first (so short ones derive)."""
    check_vary(base, vary)
    n = count_points(vary, seeds)
    if n > MAX_POINTS:
        raise ValueError(f"{n:,} points is more than a sweep can hold ({MAX_POINTS:,}); "
                         "vary fewer values")
    names = list(vary)
    points = []
    for values in itertools.product(*(vary[n] for n in names), seeds):
        chosen = dict(zip(names, values[:-1]))
        options = {k: chosen.pop(k) for k in list(chosen) if k in OPTIONS}
        points.append((base.replace(**chosen, seed=values[-1]), options))
    return sorted(points, key=lambda p: -p[0].num_epochs)


def default_train(config: TrainConfig, warmup_epochs: float = 0.0,
                  nprocs: int = 0) -> TrainResult:
    """`train` without output; with warmup, the same loop with a linear lr warmup; with
    `nprocs`, DDP over that many processes (gloo on a CPU, nccl on GPUs). A DDP job that fails
    is a result with status "failed" and the error in `extra`."""
    if nprocs and warmup_epochs:
        raise ValueError("warmup with DDP processes is not implemented; vary one of them")
    if nprocs:
        try:
            return launch(config, nprocs)
        except LaunchError as e:
            return TrainResult.create(config, hardware=f"DDP, {nprocs} processes",
                                      num_devices=nprocs, data_source="unknown",
                                      steps_per_epoch=0, status="failed",
                                      extra={"error": str(e)})
    if warmup_epochs:
        return train_warmup(config, warmup_epochs)
    return train(config, progress=False)


def sweep(base: TrainConfig, vary: dict, *, seeds: Sequence[int] = (0, 1, 2), store,
          train_fn: Optional[Callable[..., TrainResult]] = None,
          log: Optional[Callable[[str], None]] = None) -> list[Record]:
    """Train every point of `vary` x `seeds` not yet in `store`; return the points' records.

    Args:
        base: the config every point starts from.
        vary: {field: [values]}; fields of TrainConfig, `warmup_epochs` or `nprocs`.
        seeds: one run per seed for every combination.
        store: a JSON Lines file; read first, then one record appended per new point.
        train_fn: `train_fn(config, **options) -> TrainResult` (default: `default_train`).
        log: called with one line per point (e.g. `print`).
    """
    train_fn = train_fn or default_train
    points = expand(base, vary, seeds)
    results.check_writable(store, store=True)     # a bad path fails now, not after training
    records = [r for r in load_store(store) if r.status != "failed"]
    by_key = {r.key: r for r in records}
    out = []
    for config, options in points:
        key = point_key(config, options)
        rec = by_key.get(key) or _derive(records, config, options)
        action = "stored" if key in by_key else "derived" if rec else "trained"
        if rec is None:
            t0 = time.perf_counter()
            rec = record_from_result(train_fn(config, **options), config, options)
            rec.extra.setdefault("wall_seconds", round(time.perf_counter() - t0, 2))
        if key not in by_key:
            results.append(store, rec.to_dict())
            if rec.status != "failed":
                records.append(rec)
                by_key[key] = rec
        out.append(rec)
        if log:
            log(f"{action:7s} {describe_point(config, options)}: {rec.status}, "
                f"test acc {rec.final_test_acc:.3f}, {rec.sec_per_epoch:.1f} s/epoch")
    return out


def _derive(records: Sequence[Record], config: TrainConfig, options: dict) -> Optional[Record]:
    want = _longer_key(config.to_dict(), options)
    for r in records:
        if r.config["num_epochs"] > config.num_epochs and r.derived_from is None and \
                _longer_key(r.config, r.options) == want:
            rec = truncate(r, config, options)
            if rec is not None:
                return rec
    return None


def describe_point(config: TrainConfig, options: dict) -> str:
    text = (f"batch {config.batch_size}, lr {config.lr:g}, {config.num_epochs} epochs, "
            f"seed {config.seed}")
    return text + "".join(f", {k} {v:g}" for k, v in options.items() if v)


# --- Learning-rate scaling and warmup (pure arithmetic) --------------------------------------

def linear_scaled_lr(base_lr: float, base_batch: int, batch: int) -> float:
    """Goyal et al. (2017): multiply the lr by k when the global batch grows k-fold. Rounded to
    12 digits so that 0.1 x 4 is 0.4 and finds the stored point (0.1 * 512 / 128 is not 0.4)."""
    return round(base_lr * batch / base_batch, 12)


def warmup_factor(step: int, warmup_steps: int) -> float:
    """Linear warmup: (step + 1) / warmup_steps of the lr before `warmup_steps`, then all of it."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return 1.0
    return (step + 1) / warmup_steps


def warmup_lr(step: int, lr: float, warmup_steps: int) -> float:
    """The lr of optimizer step `step` (from 0): `lr` scaled by `warmup_factor`."""
    return lr * warmup_factor(step, warmup_steps)


def warmup_sgd(params, lr: float, warmup_steps: int) -> torch.optim.SGD:
    """Plain SGD whose lr follows `warmup_lr`: torch's `LambdaLR`, advanced after every step
    the optimizer takes (a step hook, so the epoch loop needs no scheduler call)."""
    optimizer = torch.optim.SGD(params, lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_factor(step, warmup_steps))
    optimizer.register_step_post_hook(lambda *_: schedule.step())
    return optimizer


def train_warmup(config: TrainConfig, warmup_epochs: float, *, data=None) -> TrainResult:
    """`train` with SGD's lr warmed up linearly over the first `warmup_epochs` epochs."""
    def make_optimizer(params, steps_per_epoch):
        return warmup_sgd(params, config.lr, warmup_steps=round(warmup_epochs * steps_per_epoch))
    return train(config, data=data, progress=False, make_optimizer=make_optimizer,
                 extra={"warmup_epochs": warmup_epochs})
