"""The results store: JSON Lines files, one record appended per run, and the statistics on them.

Every experiment is one `.jsonl` file; each line is one record (a dict with the header of
`mgpu_lib.training.record_header`). Appending takes a file lock (`filelock`, on every platform), so two processes
writing one store both keep their records. What the store refuses and what it keeps:
- a path that is not a regular file (a device, a FIFO, `/dev/null`) is never a store, and a
  file with a line that is not a record is "not a results store": one line, the file untouched;
- a torn last line (a run killed mid-write) is skipped with a warning; the next append drops it;
- a failed append (a full disk) cuts the store back to its old length and keeps the record in a
  file beside it (`ResultsError` says where); so does a failed `write_json_atomic`.
The records this book shows ship inside the package (`mgpu_lib/recorded/`), so a notebook finds
them in Colab as well as in a clone: `recorded(name)`.
"""
from __future__ import annotations

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
from typing import Sequence

from filelock import FileLock

from ..training import HEADER, LEGACY_SCHEMA, SCHEMA, TrainResult

RECORDED_DIR = "recorded"     # the package's folder of shipped records


class ResultsError(ValueError):
    """A store or output path that cannot be read or written; the message names it."""


def recorded(name: str) -> Path:
    """The path of a record file shipped with the package, e.g. `recorded("ex1_cpu.jsonl")`."""
    return Path(str(resources.files("mgpu_lib").joinpath(RECORDED_DIR, name)))


def _shown(path) -> str:
    """`path` short enough for a one-line message."""
    text = str(path)
    return text if len(text) <= 120 else f"{text[:60]}...{text[-50:]} ({len(text)} characters)"


def _kind(mode: int) -> str:
    return ("a folder" if stat.S_ISDIR(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")


def _mode(path: Path):
    """`path`'s st_mode, or None if nothing is there; other OSErrors (a name too long, a file
    where a folder should be) propagate."""
    try:
        return path.stat().st_mode
    except FileNotFoundError:
        return None


def _check_names(path: Path, parent: Path) -> None:
    """Raise ENAMETOOLONG now for a name the file system will refuse once it is created."""
    limit = os.pathconf(parent, "PC_NAME_MAX") if hasattr(os, "pathconf") else 255
    for name in path.relative_to(parent).parts:
        if len(os.fsencode(name)) > limit:
            raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG))


def check_writable(path, *, store: bool = False) -> Path:
    """`path` as a Path, after checking that a file can be created or appended there.

    Call it before any work starts, so a bad `--out` fails in a second, not after training.
    A symlink is followed. An output may be a character device or a FIFO (written straight
    into, never replaced); a store (`store=True`) must be a regular file or not exist yet.
    """
    if str(path) == "-":
        raise ResultsError("'-' (standard output) is not supported: name a file, or leave the "
                           "option out")
    shown = _shown(path)
    try:
        path = Path(os.path.realpath(path))
        mode = _mode(path)
        parent = path.parent
        while _mode(parent) is None and parent != parent.parent:
            parent = parent.parent
        _check_names(path, parent)
        writable = os.access(parent, os.W_OK | os.X_OK) and (mode is None or
                                                             os.access(path, os.W_OK))
    except OSError as e:
        raise ResultsError(f"cannot write {shown}: {e.strerror or e}") from None
    if mode is not None and not stat.S_ISREG(mode) and (
            store or not (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode))):
        what = "a results store must be a regular file or not exist yet" if store else \
            "an output must be a file, a character device or a FIFO"
        raise ResultsError(f"cannot write {shown}: it is {_kind(mode)}; {what}")
    if not parent.is_dir():
        raise ResultsError(f"cannot write {shown}: {parent} is not a folder")
    if not writable:
        raise ResultsError(f"cannot write {shown}: permission denied")
    return path


def _keep(text: str, path: Path, error: OSError) -> ResultsError:
    """Save `text` (a record that could not be written to `path`) in the temporary folder; the
    error to raise says where it went, or holds the record itself if that failed too."""
    cause = f"cannot write {_shown(path)}: {error.strerror or error}"
    try:
        fd, kept = tempfile.mkstemp(prefix=f"mgpu-{path.name[:40]}.", suffix=".kept")
        with os.fdopen(fd, "w") as f:
            f.write(text)
    except OSError:
        return ResultsError(f"{cause}; the result: {' '.join(text.split())}")
    return ResultsError(f"{cause}; the result was kept in {kept}")


def _write_all(fd: int, data: bytes) -> None:
    """os.write until all of `data` is written (a write may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_json_atomic(path, obj) -> None:
    """Write `obj` as JSON so that readers see the old file or the new one, never half of one.

    A symlink is followed and its target written; a character device or a FIFO is written
    straight into (never replaced). If writing fails (a full disk), the JSON is kept beside and
    ResultsError says where.
    """
    path = check_writable(path)
    text = json.dumps(obj, indent=1)
    tmp = None
    try:
        if _mode(path) is not None and not path.is_file():   # a device or a FIFO: write into it
            fd = os.open(path, os.O_WRONLY)
            try:
                _write_all(fd, text.encode())
            finally:
                os.close(fd)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            os.chmod(tmp, 0o644)       # mkstemp makes 0600; results are for everyone to read
            _write_all(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        raise _keep(text, path, e) from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


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


def save_result(result: TrainResult, path) -> None:
    """Write a run's result as JSON, atomically (`write_json_atomic`)."""
    write_json_atomic(path, result.to_dict())


def load_result(path) -> TrainResult:
    """A run's result from its JSON file; a one-line ResultsError if it is not a whole one."""
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        raise ResultsError(f"cannot read train result {_shown(path)}: {e}") from None
    try:
        return TrainResult.from_dict(d, where=_shown(path))
    except ValueError as e:
        raise ResultsError(str(e)) from None


def _lock(path: Path) -> FileLock:
    """The lock beside a store (a separate file: a lock may not truncate the store itself)."""
    return FileLock(str(path.with_name(f".{path.name}.lock")))


def append(path, record: dict) -> None:
    """Append `record` as one line, under an exclusive lock; durable when this returns.

    The store is checked first (a file that is not a store is left untouched); a torn last line
    is dropped; a failed write cuts the store back to its old length and keeps the record.
    """
    path = check_writable(path, store=True)
    line = json.dumps(record, sort_keys=True).encode() + b"\n"
    try:
        if _mode(path) is not None:     # a file that is not a store gets no lock file beside it
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _parse(path.read_bytes(), path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with _lock(path), open(path, "a+b", buffering=0) as f:
            f.seek(0)                       # append mode opens at the end
            data = f.read()
            _, whole = _parse(data, path)
            if whole and data[whole - 1:whole] != b"\n":   # a last record without its newline
                line = b"\n" + line
            try:
                f.truncate(whole)           # drops a torn last line: a record that never was
                _write_all(f.fileno(), line)
                os.fsync(f.fileno())
            except OSError:
                f.truncate(whole)           # no torn line of ours either
                raise
    except OSError as e:
        raise _keep(line.decode().strip(), path, e) from None


def _parse(data: bytes, path) -> tuple[list[dict], int]:
    """The records in a store's bytes, and the length of its whole lines (a torn last line,
    with no newline and starting like a record, is left out with a warning)."""
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
            if i == len(lines) and line.startswith("{"):
                warnings.warn(f"{Path(path).name}, line {i}: not a whole record (an "
                              f"interrupted write?); skipped", stacklevel=3)
                whole = len(data) - len(line.encode())
                continue
            raise ResultsError(f"{_shown(path)}, line {i}: not JSON, so not a results store "
                               f"(only a torn last line is an interrupted write)") from None
        if not isinstance(rec, dict):
            raise ResultsError(f"{_shown(path)}, line {i}: expected a JSON object per line, "
                               f"got {type(rec).__name__}; is this a results store?")
        records.append(rec)
    return records, whole


def read(path) -> list[dict]:
    """Every record in a store ([] if the file does not exist yet).

    Raises:
        ResultsError: the path is not a regular file, or a line is not a record.
    """
    shown = _shown(path)
    try:
        path = Path(path)
        mode = _mode(path)
        if mode is None:
            return []
        if not stat.S_ISREG(mode):
            raise ResultsError(f"results store {shown} is {_kind(mode)}, not a regular file")
        data = path.read_bytes()
    except OSError as e:
        raise ResultsError(f"cannot read results store {shown}: {e.strerror or e}") from None
    return _parse(data, path)[0]


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
    the seeds that finished (`ok` of `n`), plus how many diverged (failed runs are neither).
    Rows are sorted by `x`.

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
        rows.append(dict(x=value, n=len(groups[value]), ok=len(ok),
                         diverged=sum(r.status == "diverged" for r in groups[value]),
                         acc_mean=acc_mean, acc_std=acc_std, sec_mean=sec_mean, sec_std=sec_std))
    return rows
