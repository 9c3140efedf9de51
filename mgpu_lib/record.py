"""One header on every record, and the answers every record gives the same way.

A record is one JSON object: a run's result (`train --out`), a sweep point, a benchmark, an
accuracy pair. Each carries the same header, so any record can say what produced it:

    schema    SCHEMA (records without the key are LEGACY_SCHEMA, written before the header)
    mgpu_lib  this package's version          git  the source's revision, "+dirty" if edited
    torch     torch's version                 hardware, profile, config  what ran, where

`None` means unknown: records made before the header keep it unknown rather than guessed, and a
copy installed outside its git repository has no revision. A benchmark has no profile (its
arguments set every size), so its `profile` is None too.
"""
from __future__ import annotations

import functools
import math
import os
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Optional, Sequence

import torch

from .results import ResultsError

SCHEMA = 2
LEGACY_SCHEMA = 1
HEADER = ("schema", "mgpu_lib", "git", "torch", "hardware", "profile", "config")
# The per-epoch lists of a run, in the order they are filled.
METRICS = ("train_loss", "train_acc", "epoch_seconds", "images_per_second", "test_acc")
STATUSES = ("ok", "diverged", "failed")


def _git(*args: str, cwd: Path) -> Optional[str]:
    """A git command's output, or None if git is missing, slow or unhappy."""
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                             timeout=5, env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def code_version() -> dict:
    """{"mgpu_lib": version or None, "git": revision or None}, computed once per process.

    The revision is read only where the package sits at the top of its own repository (a
    clone, an editable install), never from some other repository it is installed inside.
    """
    try:
        version = metadata.version("mgpu_lib")
    except (metadata.PackageNotFoundError, ValueError):
        version = None
    root = Path(__file__).resolve().parent.parent
    rev = None
    if (root / ".git").exists() and _git("rev-parse", "--show-toplevel", cwd=root) == str(root):
        rev = _git("rev-parse", "--short=12", "HEAD", cwd=root)
        changes = _git("status", "--porcelain", "--untracked-files=no", cwd=root)
        if rev and changes:
            rev += "+dirty"
    return {"mgpu_lib": version, "git": rev}


def header(*, hardware: str, profile: Optional[str], config: dict) -> dict:
    """The header every new record starts with."""
    # str(): torch.__version__ is a TorchVersion, which a checkpoint's pickle refuses to load
    return {"schema": SCHEMA, **code_version(), "torch": str(torch.__version__),
            "hardware": hardware, "profile": profile, "config": dict(config)}


def final_test_acc(test_acc: Sequence[float], status: str) -> float:
    """The last epoch's test accuracy of a run that finished; nan for a run that did not.

    A diverged run's last accuracy is from before it blew up: averaged with finished runs it
    would flatter its setting, so it is nan, as for a run with no epochs.
    """
    return float(test_acc[-1]) if test_acc and status == "ok" else math.nan


def sec_per_epoch(epoch_seconds: Sequence[float]) -> float:
    """The mean epoch time; nan for a run with no epochs (0 would read as infinitely fast)."""
    return sum(epoch_seconds) / len(epoch_seconds) if epoch_seconds else math.nan


def _is_text(value, optional: bool = True) -> bool:
    return (value is None and optional) or (isinstance(value, str) and value != "")


def check_header(rec: dict, where: str) -> None:
    """Raise ResultsError (one line, naming `where`) unless `rec` carries a whole header."""
    missing = [k for k in HEADER if k not in rec]
    if missing:
        raise ResultsError(f"{where}: no {', '.join(missing)} (a record from before the "
                           f"header, schema {LEGACY_SCHEMA}?)")
    bad = [k for k in ("mgpu_lib", "git", "torch", "profile") if not _is_text(rec[k])]
    if rec["schema"] != SCHEMA:
        bad.insert(0, "schema")
    if not _is_text(rec["hardware"], optional=False):
        bad.append("hardware")
    if not isinstance(rec["config"], dict) or not rec["config"]:
        bad.append("config")
    if bad:
        raise ResultsError(f"{where}: bad header field(s) {', '.join(bad)}")


def run_problem(config, metrics, status) -> Optional[str]:
    """What keeps a run's config, per-epoch metrics and status from being whole (the config
    has its epochs and seed, every metric is a list of numbers), or None."""
    if not isinstance(config, dict) or not all(isinstance(config.get(k), int)
                                               for k in ("num_epochs", "seed")):
        return "its config has no whole num_epochs and seed"
    if not isinstance(metrics, dict):
        return "its metrics are not a dict"
    for m in METRICS:
        values = metrics.get(m)
        if not isinstance(values, list) or not all(isinstance(v, (int, float)) for v in values):
            return f"metric {m} is missing or not a list of numbers"
    if status not in STATUSES:
        return f"status {status!r} is not one of {', '.join(STATUSES)}"
    return None
