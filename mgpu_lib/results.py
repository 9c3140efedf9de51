"""The results store: JSON Lines files, one record appended per run, and the statistics on them.

Every experiment is one `.jsonl` file; each line is one record (a dict that carries its hardware,
profile and config). Appending takes a file lock, so two processes writing one store both keep
their records. A torn last line (a run killed mid-write) is skipped with a warning; the lines
before it are never lost. The records this book shows ship inside the package
(`mgpu_lib/results/`), so a notebook finds them in Colab as well as in a clone: `recorded(name)`.
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import statistics
import tempfile
import warnings
from pathlib import Path
from typing import Sequence

RECORDED = Path(__file__).resolve().parent / "results"


class ResultsError(ValueError):
    """A store or output path that cannot be read or written; the message names it."""


def recorded(name: str) -> Path:
    """The path of a record file shipped with the package, e.g. `recorded("ex1_cpu.jsonl")`."""
    return RECORDED / name


def check_writable(path) -> Path:
    """`path` as a Path, after checking that a file can be created or appended there.

    Call it before any work starts, so a bad `--out` fails in a second, not after training.
    """
    path = Path(path)
    if path.is_dir():
        raise ResultsError(f"{path} is a folder, not a file")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ResultsError(f"cannot write {path}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and
                                                     not os.access(path, os.W_OK)):
        raise ResultsError(f"cannot write {path}: permission denied")
    return path


def write_json_atomic(path, obj) -> None:
    """Write `obj` as JSON so that readers see the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.chmod(tmp, 0o644)       # mkstemp makes 0600; results are for everyone to read
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def append(path, record: dict) -> None:
    """Append `record` as one line, under an exclusive lock; durable when this returns."""
    path = check_writable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, sort_keys=True)
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            f.seek(0, os.SEEK_END)
            if f.tell():                 # a torn last line stays a line of its own
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    f.write(b"\n")
            f.write(line.encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read(path) -> list[dict]:
    """Every record in a store ([] if the file does not exist yet).

    Raises:
        ResultsError: the path is a folder, or a line holds JSON that is not a record.
    """
    path = Path(path)
    if path.is_dir():
        raise ResultsError(f"results store {path} is a folder, not a file")
    if not path.exists():
        return []
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ResultsError(f"cannot read results store {path}: {e}") from None
    records = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            warnings.warn(f"{path.name}, line {i}: not a whole record (an interrupted "
                          f"write?); skipped", stacklevel=2)
            continue
        if not isinstance(rec, dict):
            raise ResultsError(f"{path}, line {i}: expected a JSON object per line, got "
                               f"{type(rec).__name__}; is this a results store?")
        records.append(rec)
    return records


def mean_std_se(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean, sample standard deviation (n - 1) and standard error of the mean.

    The sample std is the spread a new seed would show; with one value it is nan, with none
    the mean is nan too.
    """
    values = [float(v) for v in values]
    if not values:
        return math.nan, math.nan, math.nan
    if len(values) == 1:
        return values[0], math.nan, math.nan
    std = statistics.stdev(values)
    return statistics.fmean(values), std, std / math.sqrt(len(values))


def summarize(records: Sequence, x: str) -> list[dict]:
    """One row per value of `x`: mean/std of final test accuracy and of seconds per epoch over
    the seeds that finished, plus how many diverged. Rows are sorted by `x`.

    `records` are sweep records: anything with `get(x)`, `status`, `final_test_acc` and
    `sec_per_epoch`.
    """
    groups: dict = {}
    for r in records:
        groups.setdefault(r.get(x), []).append(r)
    rows = []
    for value in sorted(groups):
        ok = [r for r in groups[value] if r.status == "ok"]
        acc_mean, acc_std, _ = mean_std_se([r.final_test_acc for r in ok])
        sec_mean, sec_std, _ = mean_std_se([r.sec_per_epoch for r in ok])
        rows.append(dict(x=value, n=len(groups[value]), diverged=len(groups[value]) - len(ok),
                         acc_mean=acc_mean, acc_std=acc_std, sec_mean=sec_mean, sec_std=sec_std))
    return rows
