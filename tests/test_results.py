"""The results store and every record's header: what the store refuses, what it keeps, and the
shipped records checked by schema."""
import csv
import errno
import io
import json
import math
import os
import re
import subprocess
import sys
from importlib import metadata
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from mgpu_lib import training as record
from mgpu_lib.book import store as results
from mgpu_lib.book.store import ResultsError
from mgpu_lib.book.sweep import as_point, load_store
from mgpu_lib.training import TrainConfig, TrainResult

from helpers import check_header, make_result, one_line

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "mgpu_lib" / "recorded").glob("*.jsonl"))


def nested_record(status="ok", epochs=2) -> dict:
    """A sweep point as stores held it before there was one record type: the metrics nested
    under "metrics", with options, and no header (schema 1)."""
    d = make_result(epochs, status).to_dict()
    metrics = {m: d.pop(m) for m in record.METRICS}
    return dict(d, metrics=metrics, options={})


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


def test_a_stored_result_carries_the_one_header_and_reads_back_as_it_was(tmp_path):
    """Issue 50: the core's TrainResult is the run (no header); the store adds the one header
    (`lab.files.record_header`) as it writes, and leaves it in the store as it reads."""
    config = TrainConfig(profile="smoke", num_epochs=1)
    result = TrainResult(config.to_dict(), hardware="CPU (AVX2), 2 threads", num_devices=1,
                         data_source="synthetic", steps_per_epoch=2)
    assert "schema" not in result.to_dict()
    store = tmp_path / "s.jsonl"
    for r in (result, as_point(result, config, {"warmup_epochs": 1.0})):
        results.append(store, r.to_dict())
    for d in results.read(store):
        check_header(d, "a stored result")
        assert d["torch"] == torch.__version__ and d["profile"] == "smoke"
        assert d["mgpu_lib"] == metadata.version("mgpu_lib")
        assert d["hardware"].startswith("CPU: ")           # the store names the CPU
    back = [results.as_run(d, "back") for d in results.read(store)]
    assert back[0] == replace(result, hardware=back[0].hardware)
    assert back[1].extra["options"] == {"warmup_epochs": 1.0}


def test_a_run_and_a_sweep_point_are_one_record_type(tmp_path):
    """Issue 29: a sweep stores and reads `TrainResult`s (its options and `derived_from` on
    them), and a point stored in the old nested form reads as the same TrainResult."""
    point = as_point(make_result(2), TrainConfig(**make_result(2).config), {"nprocs": 2})
    store = tmp_path / "s.jsonl"
    results.append(store, point.to_dict())
    (back,) = load_store(store)
    assert type(back) is TrainResult and back.extra["options"] == {"nprocs": 2}
    assert back == replace(point, hardware=back.hardware)
    assert back.metrics["test_acc"] == back.test_acc and results.value(back, "nprocs") == 2
    old = nested_record()
    store.write_text(json.dumps(old) + "\n", encoding="utf-8")
    (read_back,) = load_store(store)
    assert read_back.test_acc == old["metrics"]["test_acc"] and "options" not in read_back.extra


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
        assert (r.config, r.extra.get("options", {}), r.status) == (d["config"], d["options"],
                                                                    d["status"])


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


def test_old_records_read_without_a_header():
    assert results.as_run(nested_record(), "old").test_acc == nested_record()["metrics"][
        "test_acc"]
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


# --- a full disk leaves no torn line (issue 26, 2) ---------------------------------------------

def test_a_full_disk_leaves_no_torn_line_in_the_store(tmp_path, monkeypatch):
    """os.write takes 5 bytes of the record, then the disk is full: the store is as it was."""
    store = tmp_path / "s.jsonl"
    results.append(store, {"a": 1})
    before, room, real = store.read_bytes(), [5], os.write

    def write(fd, data):
        if room[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = real(fd, bytes(data[:room[0]]))
        room[0] -= n
        return n
    monkeypatch.setattr(results.os, "write", write)
    with pytest.raises(OSError):
        results.append(store, {"b": 2})
    assert store.read_bytes() == before


# --- what is a store (issue 26, 6 and 7) ---------------------------------------------------------

@pytest.mark.parametrize("text", ["buy milk\ncall Bob\n", "one line\n",
                                  "{precious user notes, not json"])
def test_a_file_that_is_no_store_is_refused_and_left_untouched(tmp_path, text):
    """Before (issue 33): `{precious user notes, not json` (no newline) read as a torn last
    record, and the append replaced it. A torn line is an interrupted write only after a whole
    record; nothing else is a store, and nothing is made beside it."""
    notes = tmp_path / "notes"
    notes.write_text(text, encoding="utf-8")
    for call in (lambda: results.read(notes), lambda: results.append(notes, {"a": 1}),
                 lambda: results.check_writable(notes, store=True)):
        with pytest.raises(ResultsError) as e:
            call()
        one_line(e)
    assert notes.read_text(encoding="utf-8") == text and os.listdir(tmp_path) == ["notes"]


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


@pytest.mark.parametrize("name, text", [
    ("nb.ipynb", json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5},
                            indent=1)),
    ("package.json", json.dumps({"name": "x", "version": "1.0.0"}, indent=2)),
    ("log.jsonl", '{"a": 1}\n{"a": 2}\n'),
    ("notes.txt", "my notes\n"),
    ("last.pt", None),
    ("one.jsonl", json.dumps(make_result().to_dict()) + "\n"),        # a store of one record
    ("s.jsonl", "".join(json.dumps(make_result(config={"seed": i}).to_dict()) + "\n"
                        for i in range(18))),
])
def test_an_output_replaces_only_an_earlier_result(tmp_path, name, text):
    """Before (issues 33 and 39): `train --out` replaced an 18-record sweep store, a checkpoint
    or a notebook with one result. Now each is refused in one line before the run, and kept;
    an earlier result (one JSON document) is replaced."""
    path = tmp_path / name
    if text is None:
        torch.save({"model": {"w": torch.zeros(3)}, "epoch": 1}, path)
    else:
        path.write_text(text, encoding="utf-8")
    before = path.read_bytes()
    with pytest.raises(ValueError) as e:
        results.check_output(path)
    one_line(e)
    assert path.read_bytes() == before
    old = tmp_path / "r.json"
    results.save_result(make_result(), results.check_output(old))
    results.save_result(make_result(acc=0.75), results.check_output(old))
    assert results.load_result(old).final_test_acc == 0.75


def test_a_store_holds_one_kind_of_record(tmp_path):
    """Before: `bench --out` onto a sweep store appended a benchmark, and the sweep then refused
    its own store."""
    store = tmp_path / "s.jsonl"
    results.append(store, make_result().to_dict())
    before = store.read_bytes()
    bench = {"kind": "bench", "config": {"width": 4}}
    with pytest.raises(ResultsError) as e:
        results.append(store, bench)
    one_line(e)
    with pytest.raises(ResultsError):
        results.check_writable(store, store=True, kind="bench")
    assert store.read_bytes() == before and len(load_store(store)) == 1


# ---- the packaged CSVs (issue 39) -------------------------------------------------------------

@pytest.mark.parametrize("name", ["d2l_builds.csv", "d2l_build_curves.csv"])
def test_the_packaged_csvs_hold_whole_rows_of_finite_positive_numbers(name):
    """Issue 39 found the packaged CSVs trusted; issue 50 checks them here, once, instead of at
    every load: the header is the fields', every row whole, every number finite and above 0,
    an accuracy at most 1, a flag true or false, and the file ends its last line."""
    from mgpu_lib.perf import published
    kinds = published.BUILD_KINDS if name == "d2l_builds.csv" else published.CURVE_KINDS
    text = (Path(published.__file__).parent.parent / "recorded" / name).read_text(encoding="utf-8")
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == list(kinds) and len(rows) > 1 and text.endswith("\n")
    for i, row in enumerate(rows[1:], 2):
        assert len(row) == len(kinds), (name, i)
        for column, cell in zip(kinds, row):
            value = published._typed(cell, kinds[column])
            if "bool" in kinds[column]:
                assert cell.strip().lower() in ("true", "false"), (name, i, column, cell)
            elif isinstance(value, (int, float)):
                assert math.isfinite(value) and value > 0, (name, i, column, cell)
                assert "acc" not in column or value <= 1, (name, i, column, cell)
    assert published._recorded(name, kinds)
