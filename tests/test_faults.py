"""Faults from the DDP issue, one test each: what used to go wrong (each docstring's "Before"),
and what happens now. DDP jobs are tiny (width 4, 400 images, gloo on the CPU)."""
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from mgpu_lib import ddp, supervise, sweep
from mgpu_lib.__main__ import main
from mgpu_lib.train import TrainConfig, TrainResult, make_model

from ddp_helpers import rank_pid, source, tiny


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
    monkeypatch.setattr(ddp, "supervise", started)


def _checkpoint(folder: Path, config: TrainConfig, epochs: int) -> Path:
    """A real checkpoint of `config` after `epochs` epochs, on 2 ranks."""
    net = make_model(config, "cpu")
    result = TrainResult(config=config.to_dict(), hardware="cpu", num_devices=2,
                         data_source="synthetic", steps_per_epoch=1, test_acc=[0.5] * epochs,
                         train_loss=[1.0] * epochs, train_acc=[0.4] * epochs,
                         epoch_seconds=[1.0] * epochs, images_per_second=[100.0] * epochs)
    return ddp.save_checkpoint(folder, net, torch.optim.SGD(net.parameters(), lr=config.lr),
                               config, 2, result)


def _one_line(err: str) -> bool:
    return err.count("\n") == 1 and "Traceback" not in err


# ---- 1. divergence under DDP ------------------------------------------------------------------

def test_ddp_divergence_exits_3_with_its_result(tmp_path, capsys):
    """Before: a diverged DDP run exited 1 ("exit code 3" from a rank) and wrote no --out."""
    out = tmp_path / "d.json"
    code = main(ddp_train("--epochs", "1", "--lr", "50", "--out", str(out)))
    printed = capsys.readouterr()
    assert code == 3, printed.err
    assert TrainResult.load(out).status == "diverged"
    assert printed.out.count("diverged after 1 epoch") == 1      # the summary, once


def test_sweep_stores_a_diverged_ddp_point_and_goes_on(tmp_path):
    """Before: a diverged DDP point was a LaunchError (its ranks exited 3) that ended the sweep."""
    store = tmp_path / "s.jsonl"
    records = sweep.sweep(tiny(lr=50.0), {"nprocs": [2, 0]}, seeds=[0], store=store)
    assert [(r.options["nprocs"], r.status) for r in records] == [(2, "diverged"),
                                                                  (0, "diverged")]
    assert records[0].extra["world_size"] == 2
    assert [r.status for r in sweep.load_store(store)] == ["diverged", "diverged"]


def test_sweep_stores_a_failed_ddp_point_and_goes_on(tmp_path, monkeypatch):
    """Before: a DDP point whose job failed (LaunchError) ended the whole sweep."""
    calls = []

    def fake_launch(config, nprocs):
        calls.append(config.seed)
        if config.seed == 0:
            raise supervise.LaunchError("DDP rank 1 failed: Signal 9 (SIGKILL)")
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
    blocker.write_text("not a folder")
    ckpt = blocker / "ckpt" if under else blocker
    assert main(ddp_train("--checkpoint", str(ckpt))) == 2
    err = capsys.readouterr().err
    assert _one_line(err) and str(blocker) in err, err


def test_a_worker_exception_far_from_the_end_is_the_failure_line():
    """Before: only the last 60 lines were kept, so an earlier exception became "exit code 1"."""
    shaped = ("print('[rank1]: Traceback (most recent call last):');"
              "print('[rank1]: ZeroDivisionError: division by zero');"
              "[print(f'[rank0]: busy {i}') for i in range(100)];"
              "print('Root Cause (first observed failure):');"
              "print('  rank      : 1 (local_rank: 1)'); print('  exitcode  : 1 (pid: 12)');"
              "print('  traceback : To enable traceback see: ...'); raise SystemExit(1)")
    code, lines = supervise.supervise([sys.executable, "-c", shaped], dict(os.environ), 30)
    assert code == 1
    assert supervise.failure_message(code, lines) == \
        "DDP rank 1 failed: ZeroDivisionError: division by zero"
    plain = "print('ValueError: boom'); [print(i) for i in range(100)]; raise SystemExit(1)"
    code, lines = supervise.supervise([sys.executable, "-c", plain], dict(os.environ), 30)
    assert "ValueError: boom" in supervise.failure_message(code, lines)


# ---- 3. a hung rank ---------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_a_stopped_rank_fails_the_job_within_the_collective_timeout():
    """Before: a SIGSTOPped rank left the others waiting silently for 30 minutes."""
    failure, victim, started = {}, 0, threading.Event()

    def job():
        try:
            ddp.launch(tiny(num_epochs=3), 2, collective_timeout_s=10, timeout_s=120,
                       log=lambda line: line.startswith("epoch 1/") and started.set())
        except supervise.LaunchError as e:
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
        assert not _alive(victim) and rank_pid(0) == 0 and rank_pid(1) == 0
    finally:                            # never leave a stopped worker behind
        try:
            if victim and _alive(victim) and \
                    b"worker" in Path(f"/proc/{victim}/cmdline").read_bytes():
                os.kill(victim, signal.SIGCONT)
                os.kill(victim, signal.SIGKILL)
        except OSError:                 # it went away meanwhile
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

def test_ddp_data_error_exits_2_in_one_line(tmp_path, monkeypatch, capsys):
    """Before: a missing MGPU_FASHION_MNIST_DIR under DDP exited 1 (a LaunchError), not 2."""
    monkeypatch.setenv("MGPU_FASHION_MNIST_DIR", str(tmp_path / "missing"))
    code = main(["train", "--strategy", "ddp", "--nprocs", "2", "--profile", "smoke"])
    err = capsys.readouterr().err
    assert code == 2 and _one_line(err), err
    assert "does not exist" in err and str(tmp_path / "missing") in err


# ---- 6. a checkpoint without its entries ------------------------------------------------------

def test_checkpoint_without_config_is_a_one_line_error(tmp_path, capsys, no_job):
    """Before: a format-1 checkpoint without `config` (or `world_size`) was a KeyError traceback."""
    config = tiny()
    whole = torch.load(_checkpoint(tmp_path, config, 1), weights_only=True)
    for lacking in ("config", "world_size", "result"):
        torch.save({k: v for k, v in whole.items() if k != lacking}, tmp_path / ddp.CKPT_NAME)
        with pytest.raises(ddp.CheckpointError, match=f"not an mgpu_lib DDP.*no {lacking}"):
            ddp.load_checkpoint(tmp_path, config, 2)
    assert main(ddp_train("--checkpoint", str(tmp_path), "--resume")) == 2
    err = capsys.readouterr().err
    assert _one_line(err) and "no result" in err, err


# ---- 7. resuming with fewer epochs than the checkpoint holds ----------------------------------

def test_resume_with_fewer_epochs_than_the_checkpoint_is_refused(tmp_path, capsys, no_job):
    """Before: --resume --epochs 1 over a 3-epoch checkpoint reported 3 epochs as num_epochs=1."""
    path = _checkpoint(tmp_path, tiny(), 3)
    before = path.read_bytes()
    assert ddp.load_checkpoint(tmp_path, tiny(num_epochs=3), 2)["epoch"] == 3   # done: fine
    with pytest.raises(ddp.CheckpointError, match="has 3 epochs, more than --epochs 1"):
        ddp.load_checkpoint(tmp_path, tiny(num_epochs=1), 2)
    assert main(ddp_train("--epochs", "1", "--checkpoint", str(tmp_path), "--resume")) == 2
    err = capsys.readouterr().err
    assert _one_line(err) and "has 3 epochs, more than --epochs 1" in err, err
    assert path.read_bytes() == before                 # nothing trained, nothing saved
