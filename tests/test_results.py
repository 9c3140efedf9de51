"""The results store and every record's header: what the store refuses, what it keeps, and the
shipped records checked by schema."""
import errno
import json
import math
import os
import stat
import subprocess
import sys
import threading
from importlib import metadata
from pathlib import Path

import pytest
import torch

from mgpu_lib import training as record
from mgpu_lib.book import store as results
from mgpu_lib.book.store import ResultsError
from mgpu_lib.book.sweep import Record, load_store, record_from_result
from mgpu_lib.training import TrainConfig, TrainResult

ROOT = Path(__file__).resolve().parent.parent
# FIFOs, device files, /dev and ENAMETOOLONG are POSIX; Windows has none of them.
posix = pytest.mark.skipif(os.name != "posix", reason="POSIX files and errors")
SHIPPED = sorted((ROOT / "mgpu_lib" / "recorded").glob("*.jsonl"))


def one_line(e) -> str:
    text = str(e.value if hasattr(e, "value") else e)
    assert "\n" not in text and len(text) < 400, text
    return text


def run_record(status="ok", epochs=2) -> dict:
    config = TrainConfig(num_epochs=3, seed=1).to_dict()
    return dict(config=config, options={}, status=status, hardware="CPU", profile="cpu",
                num_devices=1, steps_per_epoch=4, data_source="synthetic",
                metrics={m: [0.5] * epochs for m in record.METRICS})


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
        results.check_header(rec, f"{path.name}: record {i}")
        if rec.get("kind") == "bench":
            assert rec["profile"] is None and rec["config"]["width"] == rec["width"]
        else:
            Record.from_dict(rec, f"{path.name}: record {i}")
            assert rec["profile"] == rec["config"]["profile"]
        # Migrated, not re-measured: what was never recorded stays unknown.
        assert rec["git"] is None and rec["mgpu_lib"] is None
        assert rec["torch"] is None or rec.get("kind") == "bench"


def test_a_new_result_carries_the_whole_header_and_a_sweep_record_keeps_it():
    config = TrainConfig(profile="smoke", num_epochs=1)
    result = TrainResult.create(config, hardware="CPU", num_devices=1, data_source="synthetic",
                                steps_per_epoch=2)
    d = result.to_dict()
    results.check_header(d, "a new result")
    assert d["torch"] == torch.__version__ and d["profile"] == "smoke"
    assert d["mgpu_lib"] == metadata.version("mgpu_lib")
    assert TrainResult.from_dict(json.loads(json.dumps(d))) == result
    rec = record_from_result(result, config, {}).to_dict()
    results.check_header(rec, "its sweep record")
    assert {k: rec[k] for k in record.HEADER} == {k: d[k] for k in record.HEADER}


def test_a_benchmark_carries_the_header(monkeypatch):
    from mgpu_lib.lab import bench
    fake = {name: {"switches": {"bf16": False}, "median": 10.0} for name in ("reference", "fast")}
    monkeypatch.setattr(bench, "measure", lambda modes, **kw: {k: dict(v)
                                                              for k, v in fake.items()})
    out = bench.bench(width=4, device="cpu")
    results.check_header(out, "bench")
    assert out["profile"] is None and out["config"]["width"] == 4


def test_the_git_revision_is_cheap_and_never_fails(monkeypatch):
    rev = record.code_version.__wrapped__()["git"]
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip()
    if head:
        assert rev.split("+")[0] == head
    def broken(*args, **kwargs):
        raise OSError(errno.ENOENT, "no git")
    monkeypatch.setattr(record.subprocess, "run", broken)
    assert record.code_version.__wrapped__()["git"] is None


def test_old_records_read_as_schema_1_with_unknown_versions():
    old = Record.from_dict(run_record())
    assert old.schema == record.LEGACY_SCHEMA and old.torch is None
    with pytest.raises(ResultsError, match="no schema"):
        results.check_header(run_record(), "old")


@pytest.mark.parametrize("status,epochs", [("ok", 0), ("ok", 2), ("diverged", 2),
                                           ("diverged", 0), ("failed", 0)])
def test_a_train_result_and_its_sweep_record_agree(status, epochs):
    """Each derived property gives one answer for both kinds of record: an empty run's time is
    nan (not 0.0), and a run that did not finish has no final accuracy."""
    d = run_record(status, epochs)
    result = TrainResult(config=d["config"], hardware="CPU", num_devices=1, data_source="x",
                         steps_per_epoch=4, status=status, **d["metrics"])
    rec = record_from_result(result, TrainConfig(**d["config"]), {})
    for name in ("final_test_acc", "sec_per_epoch"):
        a, b = getattr(result, name), getattr(rec, name)
        assert a == b or (math.isnan(a) and math.isnan(b)), (name, a, b)
    assert math.isnan(result.sec_per_epoch) == (epochs == 0)
    assert math.isnan(result.final_test_acc) == (epochs == 0 or status != "ok")


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
    target.write_text("old")
    link.symlink_to(target)
    results.write_json_atomic(link, {"a": 1})
    assert link.is_symlink() and json.loads(target.read_text()) == {"a": 1}


@posix
def test_a_fifo_is_written_into_not_replaced(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    results.write_json_atomic(fifo, {"a": 1})
    reader.join(10)
    if not got:                           # free the reader: the old code replaced the FIFO
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and json.loads(got[0]) == {"a": 1}


@pytest.fixture
def null_device(tmp_path) -> Path:
    """A null device of our own in tmp_path (never the system's /dev/null)."""
    dev = tmp_path / "n"
    try:
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        dev.open("w").close()
    except (OSError, AttributeError) as e:    # not root, a file system mounted nodev, Windows
        pytest.skip(f"cannot make a device here: {e}")
    return dev


def test_a_device_is_never_replaced(null_device):
    dev = null_device
    results.write_json_atomic(dev, {"a": 1})
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
    out = tmp_path / "r.json"
    out.write_text('{"old": 1}')
    _full_disk(monkeypatch, tmp_path.parent / f"{tmp_path.name}-kept", after=3)
    with pytest.raises(ResultsError, match="No space left on device; the result was kept") as e:
        results.write_json_atomic(out, {"new": 2})
    assert json.loads(_kept(one_line(e)).read_text()) == {"new": 2}
    assert out.read_text() == '{"old": 1}' and sorted(os.listdir(tmp_path)) == ["r.json"]


def test_a_full_disk_leaves_no_torn_line_in_the_store(tmp_path, monkeypatch):
    store = tmp_path / "s.jsonl"
    results.append(store, {"a": 1})
    before = store.read_bytes()
    _full_disk(monkeypatch, tmp_path / "kept", after=5)       # the record half fits
    with pytest.raises(ResultsError, match="kept in") as e:
        results.append(store, {"b": 2})
    assert store.read_bytes() == before
    assert json.loads(_kept(one_line(e)).read_text()) == {"b": 2}
    assert issubclass(ResultsError, ValueError)      # the CLI's exit 2


# --- what is a store (issue 26, 6 and 7) ---------------------------------------------------------

def test_a_text_file_is_not_a_store_and_is_left_untouched(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("buy milk\ncall Bob\n")
    for call in (lambda: results.read(notes), lambda: results.append(notes, {"a": 1})):
        with pytest.raises(ResultsError, match="line 1: not JSON, so not a results store") as e:
            call()
        one_line(e)
    assert notes.read_text() == "buy milk\ncall Bob\n"
    assert os.listdir(tmp_path) == ["notes.txt"]          # not even a lock file beside it
    notes.write_text("one line\n")                      # no torn record either
    with pytest.raises(ResultsError):
        results.read(notes)


def test_only_a_torn_last_line_is_an_interrupted_write(tmp_path):
    store = tmp_path / "s.jsonl"
    store.write_text('{"a": 1}\n{"b": ')
    with pytest.warns(UserWarning, match="line 2: not a whole record"):
        assert results.read(store) == [{"a": 1}]
    with pytest.warns(UserWarning):
        results.append(store, {"c": 3})
    assert results.read(store) == [{"a": 1}, {"c": 3}]      # the torn line is gone
    store.write_text('{"a": 1}\n{"b": \n{"c": 3}\n')            # torn, then more: not a store
    with pytest.raises(ResultsError, match="line 2"):
        results.read(store)


@pytest.mark.parametrize("change", [dict(metrics={}), dict(config={"seed": 0}),
                                    dict(status="weird")])
def test_a_broken_record_is_one_line_not_a_key_error(tmp_path, change):
    store = tmp_path / "s.jsonl"
    store.write_text(json.dumps({**run_record(), **change}) + "\n")
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
    with pytest.raises(ResultsError, match="not a regular file"):
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
                 lambda: results.write_json_atomic("-", {"a": 1})):
        with pytest.raises(ResultsError, match="standard output"):
            call()
    assert not (tmp_path / "-").exists()
