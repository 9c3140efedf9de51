"""The results store and every record's header: what the store refuses, what it keeps, and the
shipped records checked by schema."""
import csv
import errno
import io
import json
import math
import os
import re
import stat
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch

from mgpu_lib import training as record
from mgpu_lib.book import store as results
from mgpu_lib.book.store import ResultsError
from mgpu_lib.book.sweep import as_point, load_store
from mgpu_lib.training import TrainConfig, TrainResult

from helpers import check_header, make_result, one_line, write_json_atomic

ROOT = Path(__file__).resolve().parent.parent
# FIFOs, device files, /dev and ENAMETOOLONG are POSIX; Windows has none of them.
posix = pytest.mark.skipif(os.name != "posix", reason="POSIX files and errors")
SHIPPED = sorted((ROOT / "mgpu_lib" / "recorded").glob("*.jsonl"))


def nested_record(status="ok", epochs=2) -> dict:
    """A sweep point as stores held it before there was one record type: the metrics nested
    under "metrics", with options, and no header (schema 1)."""
    d = make_result(epochs, status).to_dict()
    metrics = {m: d.pop(m) for m in record.METRICS}
    for k in record.HEADER[:4]:
        d.pop(k)
    return dict(d, metrics=metrics)


# --- the header -------------------------------------------------------------------------------

def test_the_data_folder_is_found_through_importlib_resources():
    assert not (ROOT / "mgpu_lib" / "results").exists(), "the old folder shadows nothing now"
    assert results.recorded("ex1_cpu.jsonl") == ROOT / "mgpu_lib" / "recorded" / "ex1_cpu.jsonl"
    assert {p.name for p in SHIPPED} >= {"ex1_cpu.jsonl", "bench_cpu.jsonl",
                                         "accuracy_cpu.jsonl", "ex1_claims_cpu.jsonl"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_record_carries_the_header(path):
    recs = results.read(path)
    assert recs
    for i, rec in enumerate(recs, 1):
        check_header(rec, f"{path.name}: record {i}")
        if rec.get("kind") == "bench":
            assert rec["profile"] is None and rec["config"]["width"] == rec["width"]
        elif "stage" in rec:                 # tools/gpu_check.py's stage records (issue 51)
            assert rec["status"] in ("ok", "skipped", "failed") and isinstance(rec["figures"], dict)
            assert rec["git"] and rec["mgpu_lib"] and rec["torch"]
            continue
        elif rec.get("kind") == "drop":      # the chapter's loop: test accuracy and time only
            assert len(rec["test_acc"]) == len(rec["epoch_seconds"]) == \
                rec["config"]["num_epochs"]
            assert rec["git"] and rec["mgpu_lib"] and rec["torch"]     # recorded this round
            continue
        else:
            results.as_run(rec, f"{path.name}: record {i}")
            assert rec["profile"] == rec["config"]["profile"]
        if rec["git"] is None:  # migrated, not re-measured: what was never recorded stays unknown
            assert rec["mgpu_lib"] is None
            assert rec["torch"] is None or rec.get("kind") == "bench"
        else:                   # re-recorded (issue 36: with BatchNorm's readings)
            assert rec["mgpu_lib"] and rec["torch"]
            # a run that diverged in its first epoch never reached a reading
            assert rec["test_acc_recal"] or rec.get("status") == "diverged"


def test_a_new_result_carries_the_whole_header_and_a_sweep_record_keeps_it():
    config = TrainConfig(profile="smoke", num_epochs=1)
    result = TrainResult.create(config, hardware="CPU", num_devices=1, data_source="synthetic",
                                steps_per_epoch=2)
    d = result.to_dict()
    check_header(d, "a new result")
    assert d["torch"] == torch.__version__ and d["profile"] == "smoke"
    assert d["mgpu_lib"] == metadata.version("mgpu_lib")
    assert TrainResult.from_dict(json.loads(json.dumps(d))) == result
    rec = as_point(result, config, {"warmup_epochs": 1.0}).to_dict()
    check_header(rec, "its sweep record")
    assert {k: rec[k] for k in record.HEADER} == {k: d[k] for k in record.HEADER}


def test_a_run_and_a_sweep_point_are_one_record_type(tmp_path):
    """Issue 29: a sweep stores and reads `TrainResult`s (its options and `derived_from` on
    them), and a point stored in the old nested form reads as the same TrainResult."""
    point = as_point(make_result(2), TrainConfig(**make_result(2).config), {"nprocs": 2})
    store = tmp_path / "s.jsonl"
    results.append(store, point.to_dict())
    (back,) = load_store(store)
    assert type(back) is TrainResult and back == point and back.options == {"nprocs": 2}
    assert back.metrics["test_acc"] == back.test_acc and back.get("nprocs") == 2
    old = nested_record()
    store.write_text(json.dumps(old) + "\n", encoding="utf-8")
    (read_back,) = load_store(store)
    assert read_back.test_acc == old["metrics"]["test_acc"] and read_back.options == {}
    assert read_back.schema == record.LEGACY_SCHEMA and read_back.torch is None


@pytest.mark.parametrize("name", ["ex1_cpu.jsonl", "accuracy_cpu.jsonl", "ex1_claims_cpu.jsonl"])
def test_the_shipped_sweeps_read_with_the_numbers_they_hold(name):
    """The shipped stores, in the nested form or (re-recorded) the flat one: read as
    TrainResults, every number as stored."""
    raw = results.read(results.recorded(name))
    runs = load_store(results.recorded(name))
    assert len(runs) == len(raw) and all(type(r) is TrainResult for r in runs)
    for d, r in zip(raw, runs):
        stored = d.get("metrics") or {m: d[m] for m in record.METRICS}
        assert {m: getattr(r, m) for m in record.METRICS} == json.loads(
            json.dumps(stored)) or r.status == "diverged"     # NaN != NaN
        assert (r.config, r.options, r.status) == (d["config"], d["options"], d["status"])


def test_a_benchmark_carries_the_header(monkeypatch):
    from mgpu_lib.lab import bench
    fake = {name: {"switches": {"bf16": False}, "median": 10.0} for name in ("reference", "fast")}
    monkeypatch.setattr(bench, "measure", lambda modes, **kw: {k: dict(v)
                                                              for k, v in fake.items()})
    out = bench.bench(width=4, device="cpu")
    check_header(out, "bench")
    assert out["profile"] is None and out["config"]["width"] == 4


def test_the_git_revision_is_cheap_and_never_fails(monkeypatch):
    from mgpu_lib.lab import files
    rev = files.code_version.__wrapped__()["git"]
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip()
    if head:
        assert rev.split("+")[0] == head
    def broken(*args, **kwargs):
        raise OSError(errno.ENOENT, "no git")
    monkeypatch.setattr(files.subprocess, "run", broken)
    assert files.code_version.__wrapped__()["git"] is None


def test_dirty_means_the_code_that_ran_not_the_pages_being_rewritten(monkeypatch):
    """Issue 49: pages executed in place one after another showed '+dirty' from page 02 on,
    because page 01's new outputs dirtied the clone. A changed page is not changed code."""
    from mgpu_lib.lab import files
    calls = []

    def git(*args, cwd):
        calls.append(args)
        if args[0] == "rev-parse":
            return str(cwd) if args[1] == "--show-toplevel" else "abc123"
        return " M mgpu_lib/training.py" if "mgpu_lib" in args else None
    monkeypatch.setattr(files, "_git", git)
    assert files.code_version.__wrapped__()["git"] == "abc123+dirty"
    status = next(a for a in calls if a[0] == "status")
    assert status[status.index("--") + 1:] == ("mgpu_lib", "tools")


def test_old_records_read_as_schema_1_with_unknown_versions():
    old = results.as_run(nested_record(), "old")
    assert old.schema == record.LEGACY_SCHEMA and old.torch is None
    with pytest.raises(ResultsError, match="no schema"):
        check_header(nested_record(), "old")


@pytest.mark.parametrize("status,epochs", [("ok", 2), ("diverged", 2), ("diverged", 1),
                                           ("failed", 0)])
def test_an_empty_run_has_no_time_and_an_unfinished_one_no_accuracy(status, epochs):
    """An empty run's time is nan (not 0.0, infinitely fast), and a run that did not finish
    has no final accuracy; a whole run of each status reads back as itself."""
    result = make_result(epochs, status)
    assert math.isnan(result.sec_per_epoch) == (len(result.epoch_seconds) == 0)
    assert math.isnan(result.final_test_acc) == (status != "ok")
    back = results.as_run(json.loads(json.dumps(result.to_dict())), "r")
    assert back.to_dict().keys() == result.to_dict().keys() and back.status == status


# --- no fcntl (Windows) -------------------------------------------------------------------------

@pytest.mark.slow
def test_every_module_imports_and_the_store_works_without_fcntl(tmp_path):
    """Windows has no fcntl: every module imports and a store appends and reads without it."""
    code = f"""
import sys, pkgutil, importlib, warnings
sys.modules["fcntl"] = None
warnings.simplefilter("ignore")
import mgpu_lib
for m in pkgutil.walk_packages(mgpu_lib.__path__, "mgpu_lib."):
    if not m.name.endswith("__main__"):
        importlib.import_module(m.name)
from mgpu_lib.book import store as results
results.append({str(tmp_path / 's.jsonl')!r}, {{"a": 1}})
results.append({str(tmp_path / 's.jsonl')!r}, {{"a": 2}})
assert [r["a"] for r in results.read({str(tmp_path / 's.jsonl')!r})] == [1, 2]
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]


# --- outputs that are not regular files (issue 26, 1) -------------------------------------------

@posix
def test_a_symlinked_output_writes_its_target(tmp_path):
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    target.write_text(json.dumps(make_result().to_dict(), indent=1), encoding="utf-8")
    link.symlink_to(target)
    write_json_atomic(link, {"a": 1})
    assert link.is_symlink() and json.loads(target.read_text(encoding="utf-8")) == {"a": 1}


@posix
def test_a_fifo_is_written_into_not_replaced(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)     # a reader, there before the write
    try:
        write_json_atomic(fifo, {"a": 1})
        got = os.read(reader, 1000)
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and json.loads(got) == {"a": 1}


@pytest.fixture
def null_device(tmp_path) -> Path:
    """A null device of our own in tmp_path (never the system's /dev/null)."""
    dev = tmp_path / "n"
    try:
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        dev.open("w", encoding="utf-8").close()
    except (OSError, AttributeError) as e:    # not root, a file system mounted nodev, Windows
        pytest.skip(f"cannot make a device here: {e}")
    return dev


def test_a_device_is_never_replaced(null_device):
    dev = null_device
    write_json_atomic(dev, {"a": 1})
    assert stat.S_ISCHR(os.stat(dev).st_mode) and os.stat(dev).st_rdev == os.makedev(1, 3)
    with pytest.raises(ResultsError, match="character device; a results store must be"):
        results.append(dev, {"a": 1})


# --- a full disk keeps the result (issue 26, 2) --------------------------------------------------

def _full_disk(monkeypatch, kept: Path, after: int = 0):
    """os.write takes `after` bytes, then the disk is full; kept results go to `kept`."""
    kept.mkdir()
    monkeypatch.setattr(results.tempfile, "tempdir", str(kept))
    room = [after]
    real = os.write

    def write(fd, data):
        if room[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = real(fd, bytes(data[:room[0]]))
        room[0] -= n
        return n
    monkeypatch.setattr(results.os, "write", write)


def _kept(message: str) -> Path:
    return Path(message.split("kept in ")[1])


def test_a_full_disk_keeps_the_json_and_the_old_file(tmp_path, monkeypatch):
    out, old = tmp_path / "r.json", json.dumps(make_result().to_dict(), indent=1)
    out.write_text(old, encoding="utf-8")
    _full_disk(monkeypatch, tmp_path.parent / f"{tmp_path.name}-kept", after=3)
    with pytest.raises(ResultsError, match="No space left on device; the result was kept") as e:
        write_json_atomic(out, {"new": 2})
    assert json.loads(_kept(one_line(e)).read_text(encoding="utf-8")) == {"new": 2}
    assert out.read_text(encoding="utf-8") == old and sorted(os.listdir(tmp_path)) == ["r.json"]


def test_a_full_disk_leaves_no_torn_line_in_the_store(tmp_path, monkeypatch):
    store = tmp_path / "s.jsonl"
    results.append(store, {"a": 1})
    before = store.read_bytes()
    _full_disk(monkeypatch, tmp_path / "kept", after=5)       # the record half fits
    with pytest.raises(ResultsError, match="kept in") as e:
        results.append(store, {"b": 2})
    assert store.read_bytes() == before
    assert json.loads(_kept(one_line(e)).read_text(encoding="utf-8")) == {"b": 2}
    assert issubclass(ResultsError, ValueError)      # the CLI's exit 2


# --- what is a store (issue 26, 6 and 7) ---------------------------------------------------------

def test_a_text_file_is_not_a_store_and_is_left_untouched(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("buy milk\ncall Bob\n", encoding="utf-8")
    for call in (lambda: results.read(notes), lambda: results.append(notes, {"a": 1})):
        with pytest.raises(ResultsError, match="line 1: not JSON, so not a results store") as e:
            call()
        one_line(e)
    assert notes.read_text(encoding="utf-8") == "buy milk\ncall Bob\n"
    assert os.listdir(tmp_path) == ["notes.txt"]          # not even a lock file beside it
    notes.write_text("one line\n", encoding="utf-8")                      # no torn record either
    with pytest.raises(ResultsError):
        results.read(notes)


def test_only_a_torn_last_line_is_an_interrupted_write(tmp_path):
    store = tmp_path / "s.jsonl"
    store.write_text('{"a": 1}\n{"b": ', encoding="utf-8")
    with pytest.warns(UserWarning, match="line 2: not a whole record"):
        assert results.read(store) == [{"a": 1}]
    with pytest.warns(UserWarning):
        results.append(store, {"c": 3})
    assert results.read(store) == [{"a": 1}, {"c": 3}]      # the torn line is gone
    store.write_text('{"a": 1}\n{"b": \n{"c": 3}\n', encoding="utf-8")   # torn, then more: no store
    with pytest.raises(ResultsError, match="line 2"):
        results.read(store)


@pytest.mark.parametrize("change", [dict(metrics={}), dict(config={"seed": 0}),
                                    dict(status="weird")])
def test_a_broken_record_is_one_line_not_a_key_error(tmp_path, change):
    store = tmp_path / "s.jsonl"
    store.write_text(json.dumps({**nested_record(), **change}) + "\n", encoding="utf-8")
    with pytest.raises(ResultsError, match="record 1") as e:
        load_store(store)
    one_line(e)
    with pytest.raises(ValueError, match="not a train result"):
        TrainResult.from_dict({"config": change.get("config", {}), "hardware": "x"})


@posix
@pytest.mark.parametrize("path", ["{tmp}/" + "a" * 300, "{tmp}/" + "d/" * 2500 + "r.json"],
                         ids=["300-character name", "5000-character path"])
def test_a_name_too_long_is_one_line(tmp_path, path):
    with pytest.raises(ResultsError, match="too long") as e:
        results.check_writable(path.format(tmp=tmp_path))
    one_line(e)


@posix
@pytest.mark.parametrize("device", ["/dev/null", "/dev/full"])
def test_a_device_is_refused_as_a_store_up_front(device):
    """Only stat: the system's devices are never opened here."""
    if not os.path.exists(device):            # macOS has no /dev/full
        pytest.skip(f"no {device} here")
    with pytest.raises(ResultsError, match="a results store must be a regular file") as e:
        results.check_writable(device, store=True)
    one_line(e)
    with pytest.raises(ResultsError, match="a results store must be a regular file"):
        results.read(device)


def test_a_sweep_refuses_a_device_store_before_training(null_device):
    from mgpu_lib.book import sweep

    def never(*a, **k):
        raise AssertionError("trained")
    with pytest.raises(ResultsError, match="device; a results store must be"):
        sweep.sweep(TrainConfig(), {"lr": [0.1]}, seeds=[0], store=null_device, train_fn=never)


def test_dash_is_refused_not_written_as_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for call in (lambda: results.check_writable("-"),
                 lambda: write_json_atomic("-", {"a": 1})):
        with pytest.raises(ResultsError, match="standard output"):
            call()
    assert not (tmp_path / "-").exists()


# --- issue 33: files that are not a store, or not this kind of output ------------------------

def test_a_one_line_file_without_a_newline_is_no_store_and_is_left_untouched(tmp_path):
    """Before: `{precious user notes, not json` (no newline) read as a torn last record; the
    append truncated it and wrote a record in its place. A torn line is an interrupted write
    only after a whole record."""
    notes = tmp_path / "notes"
    notes.write_text("{precious user notes, not json", encoding="utf-8")
    for call in (lambda: results.read(notes), lambda: results.append(notes, {"a": 1}),
                 lambda: results.check_writable(notes, store=True)):
        with pytest.raises(ResultsError, match="line 1: not JSON, so not a results store") as e:
            call()
        one_line(e)
    assert notes.read_text(encoding="utf-8") == "{precious user notes, not json"
    assert os.listdir(tmp_path) == ["notes"]


def test_an_output_never_replaces_a_store_a_checkpoint_or_notes(tmp_path):
    """Before: `train --out store.jsonl` replaced an 18-record sweep store with one result, and
    `--out ck/last.pt` a checkpoint. An earlier result (one JSON document) is replaced."""
    store, ckpt, notes, old = (tmp_path / n for n in ("s.jsonl", "last.pt", "n.txt", "r.json"))
    for i in range(18):
        results.append(store, make_result(config={"seed": i}).to_dict())
    torch.save({"model": {"w": torch.zeros(3)}, "epoch": 1}, ckpt)
    notes.write_text("my notes\n", encoding="utf-8")
    files = {p: p.read_bytes() for p in (store, ckpt, notes)}
    for path, says in ((store, "it is a results store (18 records)"),
                       (ckpt, "it is not a JSON document"), (notes, "it is not a JSON document")):
        with pytest.raises(ResultsError, match=re.escape(f"will not replace {path}: {says}")) as e:
            write_json_atomic(path, make_result().to_dict())
        one_line(e)
    assert {p: p.read_bytes() for p in files} == files
    results.save_result(make_result(), old)
    results.save_result(make_result(acc=0.75), old)          # a result replaces a result
    assert results.load_result(old).final_test_acc == 0.75


@posix
def test_a_fifo_without_a_reader_is_refused_up_front_not_waited_on(tmp_path):
    """Before: `train --out FIFO` trained, then blocked forever in open()."""
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    with pytest.raises(ResultsError, match="a FIFO that nobody reads") as e:
        results.Output(fifo)
    one_line(e)


@pytest.mark.parametrize("change, problem", [
    (dict(schema=3), "schema 3, and this mgpu_lib reads schemas 1 and 2"),
    (dict(test_acc=[0.3, 0.3, 0.3]), "test_acc has 3 values for 1 epoch"),
    (dict(test_acc=[True]), "test_acc is missing or not a list of numbers"),
    (dict(test_acc=[math.nan]), "test_acc holds a value that is negative or not finite"),
    (dict(train_loss=[1e309]), "train_loss holds a value that is negative or not finite"),
    (dict(train_acc=[1.5]), "train_acc holds an accuracy above 1"),
    (dict(epoch_seconds=[]), "epoch_seconds has 0 values for 1 epoch (ok)"),
])
def test_a_record_that_cannot_be_a_run_is_refused_in_one_line(tmp_path, change, problem):
    """Before: schema 3 read as stored points; 3 test accuracies for 1 epoch, [true], [NaN] or
    [1e309] were reported as finished runs ("test acc 0.300", "nan", "inf")."""
    store = tmp_path / "s.jsonl"
    rec = {**make_result(1).to_dict(), **change}
    store.write_text(json.dumps(rec) + "\n", encoding="utf-8")     # 1e309 is written as Infinity
    with pytest.raises(ResultsError, match=re.escape(f"record 1 is not a run's record ({problem}")
                       ) as e:
        load_store(store)
    one_line(e)
    (tmp_path / "r.json").write_text(json.dumps(rec, indent=1), encoding="utf-8")
    with pytest.raises(ResultsError, match=re.escape(problem)):
        results.load_result(tmp_path / "r.json")


def test_a_store_holds_one_kind_of_record(tmp_path):
    """Before: `bench --out` onto a sweep store appended a benchmark, and the sweep then refused
    its own store."""
    store = tmp_path / "s.jsonl"
    results.append(store, make_result().to_dict())
    before = store.read_bytes()
    bench = {"kind": "bench", "config": {"width": 4}}
    with pytest.raises(ResultsError, match="holds run records, and a store holds one kind") as e:
        results.append(store, bench)
    one_line(e)
    with pytest.raises(ResultsError, match="a bench record does not go there"):
        results.check_writable(store, store=True, kind="bench")
    assert store.read_bytes() == before and len(load_store(store)) == 1


@pytest.mark.parametrize("name", ["newdir/", "runs/new/"])
def test_a_trailing_slash_names_a_folder_never_a_file(tmp_path, monkeypatch, name):
    """Before: `--out newdir/` wrote a file named newdir."""
    monkeypatch.chdir(tmp_path)
    for call in (lambda: write_json_atomic(name, {"a": 1}),
                 lambda: results.append(name, {"a": 1})):
        with pytest.raises(ResultsError, match="a name ending in '/' is a folder") as e:
            call()
        one_line(e)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name, text, says", [
    ("nb.ipynb", json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5},
                            indent=1), "it is a Jupyter notebook"),
    ("package.json", json.dumps({"name": "x", "version": "1.0.0"}, indent=2),
     "it is a JSON document (4 lines), not a run's result"),
    ("user.json", '{"name": "x"}', "it is a JSON document (1 line), not a run's result"),
    ("log.jsonl", '{"a": 1}\n{"a": 2}\n', "it is JSON Lines, not a run's result"),
])
def test_an_output_replaces_only_an_earlier_result(tmp_path, name, text, says):
    """Before (issue 39): `train --out nb.ipynb` replaced a notebook (any multi-line JSON) with the
    result; a one-line user JSON was refused as 'a results store (1 record)'."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ResultsError, match=re.escape(f"will not replace {path}: {says};")) as e:
        write_json_atomic(path, make_result().to_dict())
    one_line(e)
    assert path.read_text(encoding="utf-8") == text


def test_a_one_record_store_is_still_a_store(tmp_path):
    store = tmp_path / "s.jsonl"
    results.append(store, make_result().to_dict())
    with pytest.raises(ResultsError, match=re.escape("it is a results store (1 record)")):
        write_json_atomic(store, make_result().to_dict())


def test_a_boolean_schema_is_no_schema():
    """Before (issue 39): `"schema": true` read as schema 1 (True == 1 in Python)."""
    with pytest.raises(ResultsError, match="schema True"):
        results.as_run({**make_result().to_dict(), "schema": True}, "r.json")


def test_a_negative_zero_accuracy_reads_as_zero():
    """Before (issue 39): a record's `test_acc [-0.0]` printed as '-0.000'."""
    run = results.as_run(make_result(1, acc=-0.0).to_dict(), "r.json")
    assert math.copysign(1, run.test_acc[-0]) == 1 and "-0.0" not in run.summary()


# ---- the packaged CSVs (issue 39) -------------------------------------------------------------

def _corrupt(name: str, row: int, column: str, value: str) -> str:
    """The packaged CSV `name` with one cell changed (row 2 is the first data row)."""
    from mgpu_lib.perf import published
    text = (Path(published.__file__).parent.parent / "recorded" / name).read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    header = lines[0].rstrip("\n").split(",")
    cells = next(csv.reader([lines[row - 1]]))
    cells[header.index(column)] = value
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(cells)
    lines[row - 1] = buf.getvalue()
    return "".join(lines)


@pytest.mark.parametrize("name, change, says", [
    ("d2l_builds.csv", (5, "sec_per_epoch_1", "nan"), "row 5: sec_per_epoch_1 'nan' is out of"),
    ("d2l_builds.csv", (3, "sec_per_epoch_2", "inf"), "row 3: sec_per_epoch_2 'inf' is out of"),
    ("d2l_builds.csv", (2, "sec_per_epoch_1", "0"), "row 2: sec_per_epoch_1 '0' is out of"),
    ("d2l_builds.csv", (2, "sec_per_epoch_1", "-3.5"), "row 2: sec_per_epoch_1 '-3.5' is out"),
    ("d2l_builds.csv", (4, "test_acc_2", "5.0"), "row 4: test_acc_2 '5.0' is out of range"),
    ("d2l_builds.csv", (2, "batch_1", "x"), "row 2: batch_1 'x' is not int"),
    ("d2l_builds.csv", (2, "lazy_layers", "yes"), "row 2: lazy_layers 'yes' is not bool"),
    ("d2l_build_curves.csv", (7, "test_acc_from_figure", "1.5"), "row 7: test_acc_from_figure"),
    ("d2l_build_curves.csv", (7, "epoch", "-1"), "row 7: epoch '-1' is out of range"),
    ("d2l_builds.csv", "bom", "row 1: the header is not framework,"),
    ("d2l_builds.csv", "extra column", "row 2: 23 cells for 22 columns"),
    ("d2l_builds.csv", "torn", "row 109: no newline at its end (a torn row?)"),
    ("d2l_build_curves.csv", "header only", ": a header and no rows"),
])
def test_a_corrupted_packaged_csv_is_one_error_naming_file_and_row(name, change, says):
    """Before (issue 39): the packaged CSVs were trusted: a NaN, inf, zero or negative time, an
    accuracy of 5.0, a header only, a byte-order mark, an extra column or a torn last row loaded
    silently or was a KeyError."""
    from mgpu_lib.perf import published
    kinds = published.BUILD_KINDS if name == "d2l_builds.csv" else published.CURVE_KINDS
    good = _corrupt(name, 2, next(iter(kinds)), "pytorch")
    text = {"bom": "\ufeff" + good, "header only": good.splitlines(keepends=True)[0],
            "torn": good[:len(good) - len(good.splitlines()[-1]) // 2],
            "extra column": good.replace("\n", ",x\n", 2).replace(",x\n", "\n", 1)}.get(change) \
        if isinstance(change, str) else _corrupt(name, *change)
    assert published._recorded(name, kinds, good)           # the copy itself is fine
    with pytest.raises(ValueError, match=re.escape(f"{name}") + ".*" + re.escape(says)) as e:
        published._recorded(name, kinds, text)
    one_line(e)
