"""The results store: JSON Lines files, one record appended per run, and the statistics on them.

A store holds one kind of record (`record_kind`), one a line; appending takes a file lock, so
two processes writing one store both keep their records. The records this book shows ship in
the package (`recorded(name)`), so Colab finds them too; they are never written at run time."""
from __future__ import annotations

import json
import math
import os
import statistics
import warnings
from importlib import resources
from pathlib import Path
from typing import Optional, Sequence

from filelock import FileLock

from ..ddp import write_atomic
from ..lab.files import HEADER, stamp
from ..training import TrainResult, check_out

class ResultsError(ValueError):
    """A store or output path that cannot be read or written; the message names it."""


def recorded(name: str) -> Path:
    """The path of a record file shipped with the package, e.g. `recorded("ex1_cpu.jsonl")`."""
    return Path(str(resources.files("mgpu_lib").joinpath("recorded", name)))


def record_kind(rec: dict) -> str:
    """A store record's kind: its "kind" ("bench"), "gpu_check stage" or "run" (a TrainResult)."""
    return str(rec.get("kind") or ("gpu_check stage" if "stage" in rec else "run"))


def check_writable(path, *, store: bool = False, kind: Optional[str] = None) -> Path:
    """`path` as a Path, once a file can be written there (not a folder, in a folder we may
    write): call it before any work. An existing store (`store=True`) must be one, of records
    of `kind` alone, if given: a store holds one kind."""
    path = Path(path)
    folder = next(p for p in path.absolute().parents if p.exists())
    why = ("it is a folder" if path.is_dir() else f"{folder} is not a folder"
           if not folder.is_dir() else "permission denied"
           if not os.access(path if path.exists() else folder, os.W_OK) else None)
    if why:
        raise ResultsError(f"cannot write {path}: {why}")
    if store:
        _check_kind(read(path), kind, path)
    return path


def _check_kind(records: Sequence[dict], kind: Optional[str], path: Path) -> None:
    other = next((record_kind(r) for r in records if kind and record_kind(r) != kind), None)
    if other is not None:
        raise ResultsError(f"{path} holds {other} records, and a store holds one kind: a "
                           f"{kind} record does not go there (name another file)")


def plural(n: int, word: str) -> str:
    """'1 point', '2 points', '1,000 points'."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def check_output(path) -> Path:
    """`path` once a run's result may be saved there (`--out`), checked before the run: it
    replaces only an empty file or an earlier run's result (`training.check_out`), never a
    store, a notebook or notes."""
    path = check_writable(path)
    check_out(path)
    data = path.read_bytes().strip() if path.is_file() else b""
    if data and b"\n" not in data:     # `save_result` indents a result: one line is a store's
        raise ResultsError(f"will not replace {path}: it is a results store (1 record); name "
                           f"another file")
    return path


SWEEP_KEYS = ("options", "derived_from")     # a sweep point's, in `extra` (older: top level)


def as_run(d: dict, where: str) -> TrainResult:
    """A record (a store's line, a result file) as a `TrainResult`: its header left in the store,
    also from older stores (metrics under "metrics", a sweep point's options at the top); else
    a one-line ValueError."""
    if isinstance(d.get("metrics"), dict):
        d = {**{k: v for k, v in d.items() if k != "metrics"}, **d["metrics"]}
    extra = {**{k: d[k] for k in SWEEP_KEYS if d.get(k)}, **(d.get("extra") or {})}
    header = set(HEADER) - {"hardware", "config"}       # which a run holds too
    run = {k: v for k, v in d.items() if k not in header and k not in SWEEP_KEYS}
    try:
        return TrainResult(**{**run, "extra": extra})
    except TypeError as e:
        raise ValueError(f"{where} is not a train result ({e})") from None


def value(r: TrainResult, name: str):
    """A sweep point's option or its config's field, by name (what a sweep's table groups by)."""
    return r.extra.get("options", {}).get(name, r.config.get(name))


def save_result(result: TrainResult, path) -> None:
    """Write a run's result as JSON to `path`, atomically (`check_output` it before the run)."""
    write_atomic(path, json.dumps(stamp(result.to_dict()), indent=1))


def load_result(path) -> TrainResult:
    """A run's result from its JSON file."""
    return as_run(json.loads(Path(path).read_text(encoding="utf-8")), str(path))


def write_fully(fd: int, data: bytes) -> None:
    """os.write until all of `data` is written (a write may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def append(path, record: dict) -> None:
    """Append `record` (`stamp`ed) as one line, under an exclusive lock; durable on return. A
    file that is no store, or of another kind, is left untouched; a torn last line (an
    interrupted write) is dropped, and a failed write leaves none of its own."""
    record = stamp(record)
    kind = record_kind(record)
    path = check_writable(path, store=True, kind=kind)     # before the lock file is made
    line = json.dumps(record, sort_keys=True).encode() + b"\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    # the lock is a file beside the store: a lock may not truncate the store itself
    with FileLock(str(path.with_name(f".{path.name}.lock"))), open(path, "a+b", buffering=0) as f:
        f.seek(0)                           # append mode opens at the end
        data = f.read()
        records, whole = _parse(data, path)
        _check_kind(records, kind, path)     # another writer's, since the check
        if whole and data[whole - 1:whole] != b"\n":     # a last record without its newline
            line = b"\n" + line
        try:
            f.truncate(whole)               # drops a torn last line: a record that never was
            write_fully(f.fileno(), line)
            os.fsync(f.fileno())
        except OSError:
            f.truncate(whole)               # no torn line of ours either
            raise


def _parse(data: bytes, path) -> tuple[list[dict], int]:
    """The records in a store's bytes, and the length of its whole lines; a torn last line
    after a whole record (an interrupted write) is left out with a warning."""
    lines = data.decode().split("\n")
    records, whole = [], len(data)
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if not (i == len(lines) and line.startswith("{") and records):
                raise ResultsError(f"{path}, line {i}: not JSON, so not a results store") from None
            warnings.warn(f"{Path(path).name}, line {i}: not a whole record (an interrupted "
                          f"write?); skipped", stacklevel=3)
            whole = len(data) - len(line.encode())
    return records, whole


def read(path) -> list[dict]:
    """Every record in a store ([] if the file does not exist yet)."""
    path = Path(path)
    return _parse(path.read_bytes(), path)[0] if path.exists() else []


def mean_std_se(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean, sample standard deviation (n - 1; nan for one value) and standard error."""
    values = [float(v) for v in values]
    mean = statistics.fmean(values) if values else math.nan
    std = statistics.stdev(values) if len(values) > 1 else math.nan
    return mean, std, std / math.sqrt(max(len(values), 1))


def summarize(records: Sequence, x: str) -> list[dict]:
    """One row per value of `x`, sorted: mean/std of final test accuracy and of seconds per
    epoch over the finished seeds (`ok` of `n`), and how many diverged."""
    groups: dict = {}
    for r in records:
        groups.setdefault(value(r, x), []).append(r)
    rows = []
    for x_value in sorted(groups):
        ok = [r for r in groups[x_value] if r.status == "ok"]
        acc_mean, acc_std, _ = mean_std_se([r.final_test_acc for r in ok])
        sec_mean, sec_std, _ = mean_std_se([r.sec_per_epoch for r in ok])
        rows.append(dict(x=x_value, n=len(groups[x_value]), ok=len(ok),
                         diverged=sum(r.status == "diverged" for r in groups[x_value]),
                         acc_mean=acc_mean, acc_std=acc_std, sec_mean=sec_mean, sec_std=sec_std))
    return rows
