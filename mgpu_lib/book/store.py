"""The results store: JSON Lines files, one record appended per run, and the statistics on them.

A store holds one kind of record (`record_kind`), one a line; appending takes a file lock, so
two processes writing one store both keep their records. The records this book shows ship in
the package (`recorded(name)`), so Colab finds them too; they are never written at run time."""
from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import stat
import statistics
import tempfile
import warnings
from importlib import resources
from pathlib import Path
from typing import Optional, Sequence

from filelock import FileLock

from ..config import _int as _is_int
from ..ddp import write_atomic
from ..lab.files import file_kind, stamp, write_fully
from ..training import LEGACY_SCHEMA, METRICS, SCHEMA, STATUSES, TrainResult, check_out

RECORDED_DIR = "recorded"     # the package's folder of shipped records
MAX_RESULT_BYTES = 16 << 20   # a larger file is no run's result (a checkpoint, a data set)


class ResultsError(ValueError):
    """A store or output path that cannot be read or written; the message names it."""


def recorded(name: str) -> Path:
    """The path of a record file shipped with the package, e.g. `recorded("ex1_cpu.jsonl")`."""
    return Path(str(resources.files("mgpu_lib").joinpath(RECORDED_DIR, name)))


def _shown(path) -> str:
    """`path` short enough for a one-line message."""
    text = str(path)
    return text if len(text) <= 120 else f"{text[:60]}...{text[-50:]} ({len(text)} characters)"


def _mode(path: Path):
    """`path`'s st_mode, or None if nothing is there; other OSErrors (a name too long) propagate."""
    try:
        return path.stat().st_mode
    except FileNotFoundError:
        return None


def record_kind(rec: dict) -> str:
    """A store record's kind: its "kind" ("bench"), "gpu_check stage" or "run" (a TrainResult)."""
    return str(rec.get("kind") or ("gpu_check stage" if "stage" in rec else "run"))


def check_writable(path, *, store: bool = False, kind: Optional[str] = None) -> Path:
    """`path` as a Path (a symlink followed), once a file can be created or appended there:
    call it before any work. An output may also be a character device or a FIFO; a store
    (`store=True`) must be a regular file of records (of `kind`, if given) or not exist yet."""
    if str(path) == "-":
        raise ResultsError("'-' (standard output) is not supported: name a file, or leave the "
                           "option out")
    shown = _shown(path)
    if str(path).endswith(("/", os.sep)):
        raise ResultsError(f"cannot write {shown}: a name ending in '/' is a folder; name a "
                           f"file in it")
    try:
        path = Path(os.path.realpath(path))
        mode = _mode(path)
        parent = path.parent
        while _mode(parent) is None and parent != parent.parent:
            parent = parent.parent
        # a name the file system will refuse once it is created: ENAMETOOLONG now
        limit = os.pathconf(parent, "PC_NAME_MAX") if hasattr(os, "pathconf") else 255
        if any(len(os.fsencode(name)) > limit for name in path.relative_to(parent).parts):
            raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG))
        writable = os.access(parent, os.W_OK | os.X_OK) and (mode is None or
                                                             os.access(path, os.W_OK))
    except OSError as e:
        raise ResultsError(f"cannot write {shown}: {e.strerror or e}") from None
    if mode is not None and not stat.S_ISREG(mode) and (
            store or not (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode))):
        what = "a results store must be a regular file or not exist yet" if store else \
            "an output must be a file, a character device or a FIFO"
        raise ResultsError(f"cannot write {shown}: it is {file_kind(mode)}; {what}")
    if not parent.is_dir():
        raise ResultsError(f"cannot write {shown}: {parent} is not a folder")
    if not writable:
        raise ResultsError(f"cannot write {shown}: permission denied")
    if store and mode is not None:      # a file that is no store, or another kind's: now
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # a torn line: its reader says so
            _check_kind(read(path), kind, shown)
    return path


def _check_kind(records: Sequence[dict], kind: Optional[str], shown: str) -> None:
    other = next((record_kind(r) for r in records if record_kind(r) != kind), None)
    if kind is not None and other is not None:
        raise ResultsError(f"{shown} holds {other} records, and a store holds one kind: a "
                           f"{kind} record does not go there (name another file)")


def _keep(text: str, path: Path, error: OSError) -> ResultsError:
    """Save `text`, not written to `path`, in the temporary folder; the error to raise says
    where, or holds the record itself if that failed too."""
    cause = f"cannot write {_shown(path)}: {error.strerror or error}"
    try:
        fd, kept = tempfile.mkstemp(prefix=f"mgpu-{path.name[:40]}.", suffix=".kept")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError:
        return ResultsError(f"{cause}; the result: {' '.join(text.split())}")
    return ResultsError(f"{cause}; the result was kept in {kept}")


def _check_replaceable(path: Path, shown: str) -> None:
    """Refuse to replace anything but an earlier run's result or an empty file: the core's
    `check_out` (the DDP program's too), then what a store line or a partial result is."""
    what = "it is not a JSON document (a checkpoint? notes?)"
    try:
        check_out(path)
    except ValueError:
        data = path.read_bytes() if path.stat().st_size <= MAX_RESULT_BYTES else b""
        what = (_what_json(data, path) or what) if data else what
        raise ResultsError(f"will not replace {shown}: {what}; an output holds one run's "
                           f"result, so name another file or remove this one") from None
    if path.stat().st_size <= MAX_RESULT_BYTES:
        data = path.read_bytes()
        if not data.strip():
            return                                  # empty, or blank lines only
        what = _what_json(data, path) or what
        if what == "a run's result":
            return
    raise ResultsError(f"will not replace {shown}: {what}; an output holds one run's result, "
                       f"so name another file or remove this one")


def _what_json(data: bytes, path: Path) -> Optional[str]:
    """What JSON `data` is, in words ("a run's result": replaceable), or None: not JSON."""
    try:
        doc = json.loads(data)
    except ValueError:                              # JSON Lines, or not JSON at all
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                records = _parse(data, path)[0]
        except ResultsError:
            return None
        return (f"it is a results store ({plural(len(records), 'record')})"
                if all(map(_is_record, records)) else "it is JSON Lines, not a run's result")
    lines = len(data.strip().splitlines())
    if isinstance(doc, dict) and _is_record(doc) and lines == 1:    # a store's line, appended
        return "it is a results store (1 record)"
    if isinstance(doc, dict) and run_problem(_flat(doc)) is None:
        return "a run's result"
    if isinstance(doc, dict) and "nbformat" in doc:
        return "it is a Jupyter notebook"
    return f"it is a JSON document ({plural(lines, 'line')}), not a run's result"


def _is_record(d: dict) -> bool:
    """Whether a JSON object is a store's record: a header's schema, a kind, or a whole run."""
    return "schema" in d or "kind" in d or run_problem(_flat(d)) is None


def plural(n: int, word: str) -> str:
    """'1 point', '2 points', '1,000 points'."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


class Output(contextlib.AbstractContextManager):
    """A run's output file (`--out`), checked before the run and written after it: a regular
    file is replaced atomically, only if empty or an earlier run's result; a FIFO or character
    device is opened now and written into. A failed write keeps the JSON and says where."""

    def __init__(self, path):
        shown = _shown(path)
        self.path = check_writable(path)
        self.fd: Optional[int] = None
        mode = _mode(self.path)
        if mode is not None and stat.S_ISREG(mode):
            _check_replaceable(self.path, shown)
        elif mode is not None:
            # opened now, without blocking: a FIFO nobody reads would hang the run's end forever
            try:
                self.fd = os.open(self.path, os.O_WRONLY | getattr(os, "O_NONBLOCK", 0))
            except OSError as e:
                why = ("a FIFO that nobody reads (start its reader first, or name a file)"
                       if e.errno == errno.ENXIO else e.strerror or str(e))
                raise ResultsError(f"cannot write {shown}: {why}") from None
            if hasattr(os, "set_blocking"):
                os.set_blocking(self.fd, True)      # the reader is there: the write may wait

    def write(self, obj) -> None:
        text = json.dumps(stamp(obj) if isinstance(obj, dict) else obj, indent=1)
        try:
            if self.fd is not None:
                write_fully(self.fd, text.encode())
            else:
                write_atomic(self.path, text)
        except OSError as e:
            raise _keep(text, self.path, e) from None

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _metric_problem(name: str, values, epochs: int, status: str) -> Optional[str]:
    """What is wrong with one per-epoch list of a run, or None."""
    if not isinstance(values, list) or not all(_is_int(v) or isinstance(v, float) for v in values):
        return "is missing or not a list of numbers"
    whole = (0, epochs) if name == "test_acc" else (epochs,)   # a run may skip evaluation
    if len(values) > epochs or (status == "ok" and len(values) not in whole):
        return f"has {len(values)} values for {plural(epochs, 'epoch')} ({status})"
    # a diverged run's last loss may be inf or nan: it is why the run stopped
    checked = values[:-1] if name == "train_loss" and status == "diverged" else values
    if not all(math.isfinite(v) and v >= 0 for v in checked):
        return "holds a value that is negative or not finite"
    if name.endswith("_acc") and any(v > 1 for v in values):
        return "holds an accuracy above 1"
    return None


def run_problem(d) -> Optional[str]:
    """What keeps `d` from being a whole run, or None: a known schema and status, whole
    num_epochs and seed, and finite metrics, all of them for a run that finished ("ok")."""
    if not isinstance(d, dict):
        return "not a JSON object"
    schema, config, status = d.get("schema", LEGACY_SCHEMA), d.get("config"), d.get("status", "ok")
    if not _is_int(schema) or schema not in (LEGACY_SCHEMA, SCHEMA):    # true == 1 in Python
        return (f"schema {schema!r}, and this mgpu_lib reads schemas {LEGACY_SCHEMA} and "
                f"{SCHEMA}: a newer mgpu_lib wrote it?")
    if not isinstance(config, dict) or not all(_is_int(config.get(k)) and config[k] >= 0
                                               for k in ("num_epochs", "seed")):
        return "its config has no whole num_epochs and seed"
    if status not in STATUSES:
        return f"status {status!r} is not one of {', '.join(STATUSES)}"
    for m in METRICS:
        problem = _metric_problem(m, d.get(m), config["num_epochs"], status)
        if problem:
            return f"{m} {problem}"
    return None


def _flat(d):
    """The nested form of older stores (metrics under "metrics", schemas 1 and 2) made flat."""
    if isinstance(d, dict) and isinstance(d.get("metrics"), dict):
        d = {**{k: v for k, v in d.items() if k != "metrics"}, **d["metrics"]}
    return d


def as_run(d, where: str) -> TrainResult:
    """A record (a store's line, a result file) as a `TrainResult`, after `run_problem`, also the
    nested form of older stores; else ResultsError. A metric of -0.0 reads as 0.0."""
    d = _flat(d)
    problem = run_problem(d)
    if problem is None:               # -0.0 + 0.0 is 0.0: a zero never prints as "-0.000"
        d = {**d, **{m: [v + 0.0 if isinstance(v, float) else v for v in d[m]] for m in METRICS}}
        try:
            return TrainResult.from_dict(d, where)
        except ValueError as e:
            problem = str(e)
    raise ResultsError(f"{where} is not a run's record ({problem})")


def save_result(result: TrainResult, out) -> None:
    """Write a run's result as JSON to `out`, an `Output` or a path (checked, then atomic)."""
    with (contextlib.nullcontext(out) if isinstance(out, Output) else Output(out)) as output:
        output.write(result.to_dict())


def load_result(path) -> TrainResult:
    """A run's result from its JSON file; a one-line ResultsError if it is not a whole one."""
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ResultsError(f"cannot read train result {_shown(path)}: {e}") from None
    return as_run(d, _shown(path))


def append(path, record: dict) -> None:
    """Append `record` (`stamp`ed) as one line, under an exclusive lock; durable on return. A
    file that is no store, or of another kind, is left untouched; a torn last line is dropped;
    a failed write cuts the store back and keeps the record."""
    record = stamp(record)
    kind = record_kind(record)
    path = check_writable(path, store=True, kind=kind)
    line = json.dumps(record, sort_keys=True).encode() + b"\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # the lock is a file beside the store: a lock may not truncate the store itself
        with FileLock(str(path.with_name(f".{path.name}.lock"))), \
                open(path, "a+b", buffering=0) as f:
            f.seek(0)                       # append mode opens at the end
            data = f.read()
            records, whole = _parse(data, path)
            _check_kind(records, kind, _shown(path))    # another writer's, since the check
            if whole and data[whole - 1:whole] != b"\n":   # a last record without its newline
                line = b"\n" + line
            try:
                f.truncate(whole)           # drops a torn last line: a record that never was
                write_fully(f.fileno(), line)
                os.fsync(f.fileno())
            except OSError:
                f.truncate(whole)           # no torn line of ours either
                raise
    except OSError as e:
        raise _keep(line.decode().strip(), path, e) from None


def _parse(data: bytes, path) -> tuple[list[dict], int]:
    """The records in a store's bytes, and the length of its whole lines; a torn last line
    after a whole record is left out with a warning."""
    try:
        lines = data.decode().split("\n")
    except UnicodeDecodeError as e:
        raise ResultsError(f"cannot read results store {_shown(path)}: {e}") from None
    records, whole = [], len(data)
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) and line.startswith("{") and records:
                warnings.warn(f"{Path(path).name}, line {i}: not a whole record (an "
                              f"interrupted write?); skipped", stacklevel=3)
                whole = len(data) - len(line.encode())
                continue
            raise ResultsError(f"{_shown(path)}, line {i}: not JSON, so not a results store "
                               f"(only a torn last line after a whole record is an "
                               f"interrupted write)") from None
        if not isinstance(rec, dict):
            raise ResultsError(f"{_shown(path)}, line {i}: expected a JSON object per line, "
                               f"got {type(rec).__name__}; is this a results store?")
        records.append(rec)
    return records, whole


def read(path) -> list[dict]:
    """Every record in a store ([] if the file does not exist yet), else a ResultsError."""
    shown = _shown(path)
    try:
        path = Path(path)
        mode = _mode(path)
        if mode is None:
            return []
        if not stat.S_ISREG(mode):
            raise ResultsError(f"cannot read {shown}: it is {file_kind(mode)}; a results store "
                               f"must be a regular file")
        data = path.read_bytes()
    except OSError as e:
        raise ResultsError(f"cannot read results store {shown}: {e.strerror or e}") from None
    return _parse(data, path)[0]


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
        groups.setdefault(r.get(x), []).append(r)
    rows = []
    for value in sorted(groups):
        ok = [r for r in groups[value] if r.status == "ok"]
        acc_mean, acc_std, _ = mean_std_se([r.final_test_acc for r in ok])
        sec_mean, sec_std, _ = mean_std_se([r.sec_per_epoch for r in ok])
        rows.append(dict(x=value, n=len(groups[value]), ok=len(ok),
                         diverged=sum(r.status == "diverged" for r in groups[value]),
                         acc_mean=acc_mean, acc_std=acc_std, sec_mean=sec_mean, sec_std=sec_std))
    return rows
