"""Faults from the DDP issue, one test each: what used to go wrong (each docstring's "Before"),
and what happens now. DDP jobs are tiny (width 4, 400 images, gloo on the CPU)."""
import _pickle
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed

from mgpu_lib.book.store import load_result
from mgpu_lib import ddp
from mgpu_lib.lab import launcher
from mgpu_lib.book import sweep
from mgpu_lib.book import cli
from mgpu_lib.book.cli import main
from mgpu_lib.training import TrainConfig, TrainResult, make_model

from ddp_helpers import (HOOKS, alive, failed, gone, rank_pid, signal_job, source, tiny,
                         wait_for)
from helpers import one_line


# The CLI flags that make `tiny()` (its checkpoint keys match, so --resume finds its checkpoint).
TINY_FLAGS = ["--profile", "smoke", "--width", "4", "--train-limit", "400", "--test-limit",
              "100", "--data-source", source()]


def ddp_train(*flags) -> list:
    return ["train", "--strategy", "ddp", "--nprocs", "2", *TINY_FLAGS, *flags]


@pytest.fixture
def no_job(monkeypatch):
    """Fail the test if `launch` gets as far as starting torchrun."""
    def started(*args, **kw):
        raise AssertionError("a DDP job was started")
    monkeypatch.setattr(launcher, "supervise", started)


def _checkpoint(folder: Path, config: TrainConfig, epochs: int) -> Path:
    """A real checkpoint of `config` after `epochs` epochs, on 2 ranks."""
    net = make_model(config, "cpu")
    result = TrainResult(config=config.to_dict(), hardware="cpu", num_devices=2,
                         data_source="synthetic", steps_per_epoch=1, test_acc=[0.5] * epochs,
                         train_loss=[1.0] * epochs, train_acc=[0.4] * epochs,
                         epoch_seconds=[1.0] * epochs, images_per_second=[100.0] * epochs)
    return ddp.save_checkpoint(folder, net, torch.optim.SGD(net.parameters(), lr=config.lr),
                               result)


# ---- 1. divergence under DDP ------------------------------------------------------------------

@pytest.mark.slow
def test_ddp_divergence_exits_3_with_its_result(tmp_path, capsys):
    """Before: a diverged DDP run exited 1 ("exit code 3" from a rank) and wrote no --out."""
    out = tmp_path / "d.json"
    code = main(ddp_train("--epochs", "1", "--lr", "50", "--out", str(out)))
    printed = capsys.readouterr()
    assert code == 3, printed.err
    assert load_result(out).status == "diverged"
    assert printed.out.count("diverged after 1 epoch") == 1      # the summary, once


@pytest.mark.slow
def test_sweep_stores_a_diverged_ddp_point_and_goes_on(tmp_path):
    """Before: a diverged DDP point was a LaunchError (its ranks exited 3) that ended the sweep."""
    store = tmp_path / "s.jsonl"
    records = sweep.sweep(tiny(lr=50.0), {"nprocs": [2, 0]}, seeds=[0], store=store)
    assert [(r.extra["options"]["nprocs"], r.status) for r in records] == [(2, "diverged"),
                                                                  (0, "diverged")]
    assert records[0].num_devices == 2
    assert [r.status for r in sweep.load_store(store)] == ["diverged", "diverged"]


def test_sweep_stores_a_failed_ddp_point_and_goes_on(tmp_path, monkeypatch):
    """Before: a DDP point whose job failed (LaunchError) ended the whole sweep."""
    calls = []

    def fake_launch(config, nprocs):
        calls.append(config.seed)
        if config.seed == 0:
            raise launcher.LaunchError("DDP rank 1 failed: Signal 9 (SIGKILL)")
        return TrainResult(config=config.to_dict(), hardware="fake", num_devices=nprocs,
                           data_source="synthetic", steps_per_epoch=1, test_acc=[0.5],
                           train_loss=[1.0], train_acc=[0.4], epoch_seconds=[1.0],
                           images_per_second=[1.0])

    monkeypatch.setattr(sweep, "launch", fake_launch)
    store = tmp_path / "s.jsonl"
    records = sweep.sweep(tiny(), {"nprocs": [2]}, seeds=[0, 1], store=store)
    assert [r.status for r in records] == ["failed", "ok"]
    assert "SIGKILL" in records[0].extra["error"]
    sweep.sweep(tiny(), {"nprocs": [2]}, seeds=[0, 1], store=store)   # a rerun
    assert calls == [0, 1, 0]                      # tries only the failed point again


# ---- 2. an unwritable checkpoint folder; a worker's exception far from the end ----------------

@pytest.mark.parametrize("under", [False, True], ids=["is-a-file", "under-a-file"])
def test_unwritable_checkpoint_fails_before_training(tmp_path, capsys, no_job, under):
    """Before: an unwritable --checkpoint started the job and failed in rank 0 after an epoch."""
    blocker = tmp_path / "file"
    blocker.write_text("not a folder", encoding="utf-8")
    ckpt = blocker / "ckpt" if under else blocker
    assert main(ddp_train("--checkpoint", str(ckpt))) == 2
    err = capsys.readouterr().err
    assert str(blocker) in one_line(err)


# The exceptions the old pattern (`^\w*(Error|Exception)`) missed: their names are dotted.
# torch.cuda.OutOfMemoryError: torch.OutOfMemoryError is newer than torch 2.3 (the floor); its
# name is printed as torch.OutOfMemoryError on newer torch, torch.cuda.OutOfMemoryError on 2.3.
OOM = torch.cuda.OutOfMemoryError
DOTTED = [OOM("CUDA out of memory. Tried to allocate 2.00 GiB"),
          torch.distributed.DistNetworkError("Connection reset by peer"),
          _pickle.UnpicklingError("invalid load key, 'x'.")]
DOTTED_NAMES = [f"{OOM.__module__}.{OOM.__qualname__}", "torch.distributed.DistNetworkError",
                "_pickle.UnpicklingError"]


@pytest.mark.parametrize("error,name", list(zip(DOTTED, DOTTED_NAMES)), ids=DOTTED_NAMES)
def test_a_dotted_exception_is_named_with_its_rank(tmp_path, monkeypatch, error, name):
    """Before: "DDP rank 0 failed: exit code 1" (the pattern missed dotted names). Now the
    rank's failure record (torch's, from its error file) names the exception, however long the
    output after it."""
    ended = launcher.Ended(1, [f"[rank0]: busy {i}" for i in range(100)])
    assert str(launcher.failure([failed(tmp_path, 1, monkeypatch, error)], ended)) == \
        f"DDP rank 1 failed: {name}: {error}"


@pytest.mark.slow
@pytest.mark.parametrize("name,error", list(zip(DOTTED_NAMES, DOTTED)), ids=DOTTED_NAMES)
def test_a_worker_raising_a_dotted_exception_is_named(monkeypatch, name, error):
    """The same, end to end: rank 1 of a real torchrun job raises it (tests/worker_hooks)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(HOOKS)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    monkeypatch.setenv("MGPU_TEST_RAISE", f"{name}: {error}")
    monkeypatch.setenv("MGPU_TEST_RANK", "1")
    with pytest.raises(launcher.LaunchError) as failed:
        launcher.launch(tiny(), 2, timeout_s=120)
    assert str(failed.value).startswith(f"DDP rank 1 failed: {name}: {error}"), failed.value


@pytest.mark.slow
def test_the_shortest_collective_timeout_names_its_cause(capsys):
    """Before: `--timeout 0.001` said "DDP rank 0 failed: exit code 1"."""
    code = main(ddp_train("--epochs", "1", "--timeout", "0.001"))
    err = capsys.readouterr().err
    assert code == 1 and one_line(err)
    assert "DistNetworkError" in err or "DistStoreError" in err or "timed out" in err, err


# ---- 3. a hung rank ---------------------------------------------------------------------------

@pytest.mark.slow
def test_a_stopped_rank_fails_the_job_within_the_collective_timeout():
    """Before: a SIGSTOPped rank left the others waiting silently for 30 minutes."""
    failure, victim, started = {}, 0, threading.Event()

    def job():
        try:
            launcher.launch(tiny(num_epochs=3), 2, collective_timeout_s=10, timeout_s=120,
                       log=lambda line: line.startswith("epoch 1/") and started.set())
        except launcher.LaunchError as e:
            failure["error"] = str(e)
        failure["at"] = time.monotonic()
        started.set()                   # never wait on a job that already ended

    thread = threading.Thread(target=job)
    thread.start()
    try:
        assert started.wait(120) and "at" not in failure, f"no first epoch: {failure}"
        victim = rank_pid(1)
        assert victim, "rank 1 not found"
        os.kill(victim, signal.SIGSTOP)
        stopped = time.monotonic()
        thread.join(90)
        assert "error" in failure, f"the job outlived its stopped rank: {failure}"
        # 10 s collective timeout + supervise's 5 s grace; torchrun alone would wait 30 s more
        assert failure["at"] - stopped < 40, failure["at"] - stopped
        # rank 0 waited in a collective and timed out; rank 1 was then killed
        assert "rank 0 failed" in failure["error"], failure["error"]
        assert "a collective timed out" in failure["error"], failure["error"]
        assert not alive(victim) and rank_pid(0) == 0 and rank_pid(1) == 0
    finally:                            # never leave a stopped worker behind
        try:
            if victim and alive(victim) and "mgpu_lib.ddp" in psutil.Process(victim).cmdline():
                os.kill(victim, signal.SIGCONT)
                os.kill(victim, signal.SIGKILL)
        except (OSError, psutil.Error):     # it went away meanwhile
            pass
        thread.join(60)


# ---- 4. TrainConfig types ---------------------------------------------------------------------

@pytest.mark.parametrize("field,value", [("allow_synthetic", "no"), ("lr", True),
                                         ("profile", 123)])
def test_train_config_rejects_wrong_types(field, value):
    """Before: allow_synthetic='no' was taken as true, lr=True as 1.0, profile=123 as a name."""
    with pytest.raises(ValueError, match=field):
        TrainConfig(**{field: value})


# ---- 5. a data error under DDP ----------------------------------------------------------------

@pytest.mark.slow
def test_ddp_data_error_exits_2_in_one_line(tmp_path, monkeypatch, capsys):
    """Before: a missing MGPU_FASHION_MNIST_DIR under DDP exited 1 (a LaunchError), not 2."""
    monkeypatch.setenv("MGPU_FASHION_MNIST_DIR", str(tmp_path / "missing"))
    code = main(["train", "--strategy", "ddp", "--nprocs", "2", "--profile", "smoke"])
    err = capsys.readouterr().err
    assert code == 2 and one_line(err)
    assert "does not exist" in err and str(tmp_path / "missing") in err


# ---- round two: an existing checkpoint, another run's, SIGTERM ----------------------------

def test_checkpoint_without_resume_refuses_to_overwrite(tmp_path, capsys, no_job):
    """Before: --checkpoint DIR without --resume silently replaced DIR/last.pt, even another
    width's. Refused where input enters, before any job starts, and left as it was."""
    path = _checkpoint(tmp_path, tiny(width=8), 1)
    before = path.read_bytes()
    assert main(ddp_train("--checkpoint", str(tmp_path))) == 2
    err = capsys.readouterr().err
    assert str(path) in one_line(err)
    assert path.read_bytes() == before and os.listdir(tmp_path) == [ddp.CKPT_NAME]


@pytest.mark.slow
@pytest.mark.parametrize("bad", ["foreign", "torn"])
def test_a_resume_from_another_runs_or_a_torn_snapshot_is_one_line(tmp_path, capsys, bad):
    """Issue 50: the ranks' `restore` refuses it (no check before the job any more); the
    launcher names the rank and the CLI says it in one line, exit 2, the snapshot as it was."""
    path = _checkpoint(tmp_path, tiny(lr=0.125) if bad == "foreign" else tiny(), 1)
    if bad == "torn":
        path.write_bytes(path.read_bytes()[:1000])
    before = path.read_bytes()
    assert main(ddp_train("--checkpoint", str(tmp_path), "--resume")) == 2
    err = capsys.readouterr().err
    assert str(path) in one_line(err)
    assert ("lr was 0.125, now 0.05" if bad == "foreign" else "does not load") in err, err
    assert path.read_bytes() == before and os.listdir(tmp_path) == [ddp.CKPT_NAME]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT],
                         ids=["SIGTERM", "SIGKILL", "SIGINT"])
def test_a_signal_stops_a_ddp_job_and_leaves_nothing(tmp_path, sig):
    """Before: SIGTERM to `train --strategy ddp` exited 143 with no message and left
    /tmp/mgpu-ddp-*/config.json behind; SIGKILL (issue 33) left the folder too. Now SIGTERM is
    said in one line, and either way every process and the folder go (after SIGKILL the job's
    reaper, which outlives its parent, kills the ranks and removes the folder)."""
    code, err, started = signal_job(ddp_train("--epochs", "50"), tmp_path, sig)
    assert gone(started, 15), [p.pid for p in started if alive(p.pid)]
    assert wait_for(lambda: not list(tmp_path.glob("mgpu-ddp-*")), 30)
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
    else:                                   # Ctrl-C, and SIGTERM like it
        assert code == {signal.SIGTERM: 143, signal.SIGINT: 130}[sig], err
        words = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "interrupted (Ctrl-C)"}[sig]
        assert words in one_line(err)


# ---- issue 33: bounds, messages, leftovers --------------------------------------------------

@pytest.mark.parametrize("argv,words", [
    (["train", "--strategy", "ddp", "--nprocs", "100", "--batch-size", "200", *TINY_FLAGS],
     "100 gloo processes are more than this machine's 2 CPU cores; use at most 2"),
    (["trace", "--nprocs", "4", "--profile", "smoke"],
     "4 gloo processes are more than this machine's 2 CPU cores; use at most 2")],
    ids=["train", "trace"])
def test_more_processes_than_cores_are_refused_before_any_start(monkeypatch, capsys, no_job,
                                                                tmp_path, argv, words):
    """Before: `train --strategy ddp --nprocs 100` on 2 cores started 100 torch processes
    (9.4 GB after 9 s)."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    argv = argv + (["--out", str(tmp_path / "t")] if argv[0] == "trace" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in one_line(err)


@pytest.mark.parametrize("command", ["train", "trace"])
def test_ctrl_c_says_what_happened(monkeypatch, capsys, tmp_path, command):
    """Before: Ctrl-C printed "python -m mgpu_lib train: " and nothing after it."""
    def interrupted(*args, **kw):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "train", interrupted)
    monkeypatch.setattr(cli, "trace_ddp", interrupted)
    argv = [command, "--profile", "smoke"] + (["--out", str(tmp_path)] if command == "trace"
                                              else [])
    assert main(argv) == 130
    assert capsys.readouterr().err == (f"python -m mgpu_lib {command}: interrupted (Ctrl-C); "
                                       "stopped, no result written for the run in progress\n")


# ---- a checkpoint through a link -------------------------------------------------------------

def test_a_checkpoint_through_a_link_is_saved_where_the_link_points(tmp_path):
    """Before: a link to a checkpoint was replaced by a file and its target left stale."""
    config = tiny(num_epochs=3)
    real = _checkpoint(tmp_path / "real", config, 1)
    link = tmp_path / "link" / ddp.CKPT_NAME
    link.parent.mkdir()
    link.symlink_to(real)
    _checkpoint(link.parent, config, 2)
    assert link.is_symlink() and torch.load(real, weights_only=True)["epoch"] == 2
    assert os.listdir(real.parent) == [ddp.CKPT_NAME] and os.listdir(link.parent) == [link.name]


# ---- issue 52: the DDP program run directly, as page 05 teaches it --------------------------

def torchrun(*flags) -> list:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            "-m", "mgpu_lib.ddp", "--width", "4", "--train-limit", "400", "--test-limit", "100",
            "--batch-size", "32", "--lr", "0.05", "--data-source", "synthetic", *flags]


@pytest.mark.slow
def test_the_ddp_program_leaves_a_notebook_named_as_out_untouched(tmp_path):
    """Before (issue 52): `torchrun ... -m mgpu_lib.ddp --out nb.ipynb` replaced the notebook
    with the run's result; `train --out` refused it. Now the program checks --out at its entry
    with the same check, before any rank trains."""
    nb = tmp_path / "nb.ipynb"
    nb.write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4,
                              "nbformat_minor": 5}, indent=1), encoding="utf-8")
    before = nb.read_bytes()
    done = subprocess.run(torchrun("--epochs", "1", "--out", str(nb)), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and nb.read_bytes() == before
    assert "will not replace" in done.stdout + done.stderr
    assert "epoch 1/1" not in done.stdout                     # refused before training


@pytest.mark.slow
@pytest.mark.skipif(os.name == "nt", reason="a rank sees its parent's death by its pid (POSIX)")
def test_no_rank_outlives_a_killed_torchrun(tmp_path):
    """Before (issue 52): SIGKILL to a directly run torchrun left both ranks training,
    re-parented to PID 1; they wrote `ck/last.pt` after the command died. Now each rank exits
    when its parent is gone: none is alive 10 s later, and nothing new is written."""
    ck, out = tmp_path / "ck", tmp_path / "r.json"
    proc = subprocess.Popen(torchrun("--epochs", "500", "--checkpoint", str(ck), "--out",
                                     str(out)), cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert wait_for(lambda: (ck / "last.pt").exists(), 120), "no epoch was saved"
        ranks = [p for p in psutil.Process(proc.pid).children(recursive=True)
                 if "mgpu_lib.ddp" in " ".join(p.cmdline())]
        assert len(ranks) == 2
        os.kill(proc.pid, signal.SIGKILL)
        saved = (ck / "last.pt").stat().st_mtime_ns
        time.sleep(10)
        assert not [p.pid for p in ranks if alive(p.pid)]
        assert (ck / "last.pt").stat().st_mtime_ns == saved and not out.exists()
        assert sorted(os.listdir(ck)) == ["last.pt"]
    finally:
        for p in psutil.Process().children(recursive=True):
            p.kill()
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


@pytest.mark.slow
def test_a_bad_value_to_the_ddp_program_is_one_line_and_exit_2(tmp_path):
    env = {**os.environ, "WORLD_SIZE": "1", "RANK": "0"}
    done = subprocess.run([sys.executable, "-m", "mgpu_lib.ddp", "--lr", "abc"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "--lr" in done.stderr


def test_a_job_has_no_hidden_wall_clock_limit():
    """Before (issue 52): `launch` stopped every DDP job after 3,600 s, whatever it was doing,
    and blamed a rank. Now no limit applies unless a caller names one. Shrunk to seconds: a
    job under a 1 s cap is cut off; a 3 s job with the default ends normally."""
    import inspect
    assert inspect.signature(launcher.launch).parameters["timeout_s"].default is None
    assert inspect.signature(launcher.run_ranks).parameters["timeout_s"].default is None
    def job(seconds: int) -> list:
        return [sys.executable, "-c", f"import time; time.sleep({seconds})"]
    with pytest.raises(launcher.LaunchError, match="timed out after 1 s"):
        launcher.supervise(job(60), dict(os.environ), 1.0)
    assert launcher.supervise(job(3), dict(os.environ), None).code == 0


@pytest.mark.slow
def test_a_ddp_train_passes_no_wall_clock_limit_and_ends_with_its_result(tmp_path, monkeypatch):
    seen, real = [], launcher.supervise

    def supervise(cmd, env, timeout_s, *args, **kwargs):
        seen.append(timeout_s)
        return real(cmd, env, timeout_s, *args, **kwargs)
    monkeypatch.setattr(launcher, "supervise", supervise)
    out = tmp_path / "r.json"
    assert main(ddp_train("--epochs", "1", "--out", str(out))) == 0
    assert seen == [None] and load_result(out).status == "ok"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_stderr_never_costs_the_result(tmp_path):
    """Before (issue 52): `train ... --out m.json 2> /dev/full` exited 1 with no m.json: the
    progress bar's first write raised ENOSPC. Now a failed write turns the bar off."""
    with open("/dev/full", "w", encoding="utf-8") as full:
        done = subprocess.run([sys.executable, "-m", "mgpu_lib", "train", "--profile", "smoke",
                               "--width", "4", "--train-limit", "200", "--test-limit", "100",
                               "--epochs", "2", "--data-source", "synthetic", "--out", "m.json"],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=full, text=True,
                              timeout=300)
    assert done.returncode == 0, done.stdout
    assert load_result(tmp_path / "m.json").status == "ok"


def test_channels_last_where_it_crashes_is_refused_in_one_line(capsys):
    """Before (issue 52): `--channels-last on` at width 2 segfaulted (oneDNN, rc 139)."""
    if torch.cuda.is_available():
        pytest.skip("the crash is the CPU's")
    assert main(["train", "--profile", "smoke", "--width", "2", "--channels-last", "on"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--channels-last on" in err


def test_trace_out_never_takes_over_a_folder_of_other_files(tmp_path, capsys):
    """Before (issue 52): `trace --out myproj` replaced a user's events.json and two JSON files
    under one_bucket/ without a word."""
    proj = tmp_path / "myproj"
    (proj / "one_bucket").mkdir(parents=True)
    (proj / "events.json").write_text('{"mine": 1}', encoding="utf-8")
    (proj / "one_bucket" / "rank0.json").write_text("{}", encoding="utf-8")
    before = {p: p.read_bytes() for p in proj.rglob("*.json")}
    assert main(["trace", "--profile", "smoke", "--out", str(proj)]) == 2
    assert "not this command's traces" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in proj.rglob("*.json")} == before
    cli.check_trace_folder(tmp_path / "new")                 # a new folder is fine
    ours = tmp_path / "ours"
    (ours / "v").mkdir(parents=True)
    (ours / "events.json").write_text(json.dumps({"hardware": "cpu", "nprocs": 2, "ranks": []}),
                                      encoding="utf-8")
    (ours / "v" / "rank0.json").write_text("{}", encoding="utf-8")
    cli.check_trace_folder(ours)                             # its own earlier traces: fine


def test_the_rank_that_failed_first_is_named_not_the_survivor_torchrun_stopped(tmp_path):
    """Before (issue 52): SIGTERM to rank 1 was reported as "DDP rank 0 failed: Signal 15" in 2
    of 2 runs: torchrun SIGTERMs the survivor, both end on signal 15 with no error file, and
    the lower rank won the tie. torchrun says which processes it stopped; those come last."""
    from mgpu_lib.lab.failures import Ended, failure, read_failures
    lines = ["W1205 torch/distributed/elastic/multiprocessing/api.py:1029] Sending process 222 "
             "closing signal SIGTERM",
             "Failures:", "[1]:", "  rank      : 0 (local_rank: 0)",
             "  exitcode  : -15 (pid: 222)", "Root Cause (first observed failure):", "[0]:",
             "  rank      : 1 (local_rank: 1)", "  exitcode  : -15 (pid: 333)"]
    ended = Ended(1, lines)
    message = str(failure(read_failures(tmp_path, ended), ended))
    assert message.startswith("DDP rank 1 failed") and "SIGTERM" in message
