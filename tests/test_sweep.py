"""Sweeps: resumable, divergence recorded, epochs derived, and the warmup arithmetic."""
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from mgpu_lib.book import store as results
from mgpu_lib.book.cli import main
from mgpu_lib.data import DeviceLoader, synthetic_fashion_mnist
from mgpu_lib.book.store import summarize
from mgpu_lib.book.pages import ex1_plan
from mgpu_lib.book.profiles import get_profile
from mgpu_lib.book.sweep import (expand, key_of, linear_scaled_lr, load_store, point_key, sweep,
                                 train_warmup, warmup_lr, warmup_sgd)
from mgpu_lib.devices import DeviceError
from mgpu_lib.training import TrainConfig, train

from helpers import FakeTrain, one_line

BASE = TrainConfig(batch_size=32, lr=0.1, num_epochs=2, width=4, train_limit=256, test_limit=64,
                   data_source="synthetic", allow_synthetic=True, profile="test")


def tiny_data(seed: int = 0, batch_size: int = 32):
    """256 synthetic training images: fast, and a fresh shuffle generator for every call."""
    d = synthetic_fashion_mnist(256, 64)
    return (DeviceLoader(d["train_images"], d["train_labels"], batch_size, shuffle=True,
                         seed=seed, source="synthetic"),
            DeviceLoader(d["test_images"], d["test_labels"], 64, shuffle=False))


def test_resumed_sweep_skips_stored_points(tmp_path):
    store, fake = tmp_path / "s.jsonl", FakeTrain()
    first = sweep(BASE, {"lr": [0.1, 0.2]}, seeds=(0, 1), store=store, train_fn=fake)
    assert len(fake.calls) == 4 and len(first) == 4
    again = sweep(BASE, {"lr": [0.1, 0.2]}, seeds=(0, 1), store=store, train_fn=fake)
    assert len(fake.calls) == 4                                  # nothing retrained
    assert [r.to_dict() for r in again] == [r.to_dict() for r in first]
    sweep(BASE, {"lr": [0.1, 0.2, 0.4]}, seeds=(0, 1), store=store, train_fn=fake)
    assert [c.lr for c, _ in fake.calls[4:]] == [0.4, 0.4]       # only the new points
    assert len(load_store(store)) == 6


def test_records_carry_config_seed_metrics_hardware_profile(tmp_path):
    (r,) = sweep(BASE, {"lr": [0.2]}, seeds=(3,), store=tmp_path / "s.jsonl", train_fn=FakeTrain())
    assert r.seed == 3 and r.config["lr"] == 0.2 and r.config["profile"] == "test"
    assert r.hardware == "fake" and r.status == "ok"
    assert r.metrics["test_acc"] == [0.73, 0.74] and len(r.metrics["epoch_seconds"]) == 2
    assert key_of(r) == point_key(BASE.replace(lr=0.2, seed=3), {})


def test_diverging_lr_is_recorded_not_raised(tmp_path):
    fake = FakeTrain()
    recs = sweep(BASE, {"lr": [0.1, 50.0]}, seeds=(0,), store=tmp_path / "s.jsonl", train_fn=fake)
    assert [r.status for r in recs] == ["ok", "diverged"]
    assert math.isnan(recs[1].final_test_acc)
    rows = summarize(recs, "lr")
    assert rows[1]["diverged"] == 1 and math.isnan(rows[1]["acc_mean"])


@pytest.mark.slow
def test_real_lr_50_diverges_and_is_stored(tmp_path):
    def real(config, **options):            # the real `train`, on tiny in-memory data
        return train(config, data=tiny_data(config.seed), progress=False)
    (r,) = sweep(BASE.replace(num_epochs=1), {"lr": [50.0]}, seeds=(0,),
                 store=tmp_path / "s.jsonl", train_fn=real)
    assert r.status == "diverged" and r.metrics["test_acc"] == []
    assert load_store(tmp_path / "s.jsonl")[0].status == "diverged"


def test_store_keeps_every_point_after_an_interruption(tmp_path):
    store, fake = tmp_path / "s.jsonl", FakeTrain(fail_on=3)
    with pytest.raises(KeyboardInterrupt):
        sweep(BASE, {"lr": [0.1, 0.2, 0.4]}, seeds=(0,), store=store, train_fn=fake)
    assert [r["config"]["lr"] for r in results.read(store)] == [0.1, 0.2]
    assert not [p for p in tmp_path.iterdir()          # no temp files left; the lock stays
                if p.name not in ("s.jsonl", ".s.jsonl.lock")]
    resume = FakeTrain()
    sweep(BASE, {"lr": [0.1, 0.2, 0.4]}, seeds=(0,), store=store, train_fn=resume)
    assert [c.lr for c, _ in resume.calls] == [0.4]             # lost only the point in flight


def test_shorter_epochs_are_derived_from_the_longest_run(tmp_path):
    fake = FakeTrain()
    recs = sweep(BASE, {"num_epochs": [1, 3, 2]}, seeds=(0,), store=tmp_path / "s.jsonl",
                 train_fn=fake)
    assert [c.num_epochs for c, _ in fake.calls] == [3]
    by_epochs = {r.config["num_epochs"]: r for r in recs}
    assert by_epochs[1].metrics["test_acc"] == [0.6]
    assert by_epochs[2].metrics["test_acc"] == [0.6, 0.61]
    assert by_epochs[2].extra["derived_from"] == key_of(by_epochs[3])
    # a later sweep at 2 epochs and another lr reuses the stored 3-epoch run too
    sweep(BASE, {"lr": [0.1]}, seeds=(0,), store=tmp_path / "s.jsonl", train_fn=fake)
    assert len(fake.calls) == 1


@pytest.mark.slow
def test_k_epochs_are_the_first_k_of_a_longer_run():
    """The claim that makes derived epochs honest: no schedule, seeded shuffle and weights."""
    short = train(BASE.replace(num_epochs=1), data=tiny_data(), progress=False)
    long = train(BASE.replace(num_epochs=2), data=tiny_data(), progress=False)
    assert short.train_loss[0] == long.train_loss[0]
    assert short.test_acc[0] == long.test_acc[0]


def test_unknown_axis_is_python_s_error(tmp_path):
    with pytest.raises(TypeError, match="momentum"):
        sweep(BASE, {"momentum": [0.9]}, store=tmp_path / "s.jsonl", train_fn=FakeTrain())


def test_expand_is_the_cartesian_product_with_seeds():
    points = expand(BASE, {"lr": [0.1, 0.2], "warmup_epochs": [0, 1]}, seeds=(0, 1, 2))
    assert len(points) == 12
    assert {(c.lr, o["warmup_epochs"], c.seed) for c, o in points} == {
        (lr, w, s) for lr in (0.1, 0.2) for w in (0, 1) for s in (0, 1, 2)}
    assert point_key(BASE, {"warmup_epochs": 0}) == point_key(BASE, {})
    assert point_key(BASE, {"warmup_epochs": 1}) == point_key(BASE, {"warmup_epochs": 1.0})
    assert point_key(BASE.replace(lr=1)) == point_key(BASE.replace(lr=1.0))


def test_summarize_mean_and_sample_std(tmp_path):
    recs = sweep(BASE, {"lr": [0.1]}, seeds=(0, 2), store=tmp_path / "s.jsonl",
                 train_fn=FakeTrain())
    (row,) = summarize(recs, "lr")
    assert row["acc_mean"] == pytest.approx((0.61 + 0.63) / 2)
    assert row["acc_std"] == pytest.approx(math.sqrt(2 * 0.01 ** 2))   # n - 1 = 1
    assert row["sec_mean"] == pytest.approx(2.0) and row["n"] == 2


def test_summarize_counts_diverged_and_failed_runs_apart():
    from types import SimpleNamespace
    recs = [SimpleNamespace(config={"lr": 0.1}, extra={}, status=s, final_test_acc=0.6,
                            sec_per_epoch=1.0)
            for s in ("ok", "ok", "diverged", "failed")]
    (row,) = summarize(recs, "lr")
    assert (row["n"], row["ok"], row["diverged"]) == (4, 2, 1)


def test_a_sweep_point_records_batchnorm_readings_each_epoch_and_train_alone_does_not():
    """Issue 50: BatchNorm's readings left the core; a sweep (the records' one path) asks for
    them with `readings=lab.drop.bn_readings`, a plain `train` skips their three passes."""
    from mgpu_lib.book.sweep import default_train
    r = default_train(BASE.replace(num_epochs=2))
    assert len(r.test_acc) == len(r.test_acc_recal) == len(r.test_acc_batch) == 2
    assert all(0 <= a <= 1 for a in r.train_acc_recal) and len(r.train_acc_recal) == 2
    plain = train(BASE.replace(num_epochs=1), progress=False)
    assert len(plain.test_acc) == 1 and plain.test_acc_recal == []


def test_linear_scaling_and_warmup_arithmetic():
    assert linear_scaled_lr(0.1, 128, 512) == 0.4        # exactly: it is part of a sweep key
    assert [warmup_lr(s, 0.4, 4) for s in range(6)] == pytest.approx(
        [0.1, 0.2, 0.3, 0.4, 0.4, 0.4])
    assert warmup_lr(0, 0.4, 0) == 0.4


def test_warmup_sgd_follows_the_schedule():
    """torch's LambdaLR, stepped by the optimizer's own hook, gives the lr that `warmup_lr` (the
    hand-written rule WarmupSGD applied) gives, step for step, and SGD moves by it."""
    w = torch.nn.Parameter(torch.zeros(1))
    opt = warmup_sgd([w], lr=0.4, warmup_steps=4)
    used, moved = [], []
    opt.register_step_pre_hook(lambda o, *_: used.append(o.param_groups[0]["lr"]))
    for _ in range(7):
        w.grad = torch.ones(1)
        before = w.item()
        opt.step()
        moved.append(before - w.item())
    assert used == [warmup_lr(s, 0.4, 4) for s in range(7)]
    assert used == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4, 0.4, 0.4], abs=1e-15)
    assert moved == pytest.approx(used, rel=1e-6)       # float32 weights
    assert [g["lr"] for g in warmup_sgd([w], lr=0.4, warmup_steps=0).param_groups] == [0.4]


@pytest.mark.slow
def test_train_warmup_runs_and_records_warmup():
    r = train_warmup(BASE.replace(num_epochs=1), warmup_epochs=0.5, data=tiny_data())
    assert r.status == "ok" and r.extra["warmup_epochs"] == 0.5 and len(r.test_acc) == 1


@pytest.mark.parametrize("vary, message", [("lr=fast", "fast"),
                                            ("warmup_epochs=inf", "finite number >= 0"),
                                            ("warmup_epochs=nan", "finite number >= 0"),
                                            ("warmup_epochs=-1", "finite number >= 0")])
def test_cli_sweep_rejects_bad_vary(capsys, vary, message):
    """Before: warmup_epochs=inf gave a traceback, and nan a cryptic message."""
    with pytest.raises(SystemExit) as e:
        main(["sweep", "--vary", vary, "--store", "x.jsonl"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


# ---- the store under stress ---------------------------------------------------------------

def test_a_torn_last_line_is_skipped_and_nothing_before_it_is_lost(tmp_path):
    store = tmp_path / "s.jsonl"
    sweep(BASE, {"lr": [0.1, 0.2]}, seeds=(0,), store=store, train_fn=FakeTrain())
    with open(store, "a", encoding="utf-8") as f:
        f.write('{"config": {"lr": 0.4')               # a run killed mid-write
    with pytest.warns(UserWarning, match="line 3: not a whole record"):
        assert [r.config["lr"] for r in load_store(store)] == [0.1, 0.2]
    resume = FakeTrain()
    with pytest.warns(UserWarning):
        sweep(BASE, {"lr": [0.1, 0.2, 0.4]}, seeds=(0,), store=store, train_fn=resume)
    assert [c.lr for c, _ in resume.calls] == [0.4]
    with warnings.catch_warnings():
        warnings.simplefilter("error")                 # the append dropped the torn line
        assert sorted(r.config["lr"] for r in load_store(store)) == [0.1, 0.2, 0.4]


def test_a_store_of_the_wrong_shape_names_the_file(tmp_path, capsys):
    store = tmp_path / "wrong.jsonl"
    store.write_text('{"version": 1}\n', encoding="utf-8")
    code = main(["sweep", "--vary", "lr=0.1", "--store", str(store), "--profile", "smoke"])
    err = capsys.readouterr().err
    assert code == 2 and "wrong.jsonl" in err and err.count("\n") == 1


@pytest.mark.parametrize("where", ["folder", "under_a_file", "read_only"])
def test_unwritable_outputs_fail_before_any_work(tmp_path, capsys, where):
    """Before: train --out, sweep --store and bench --out trained fully, then died."""
    blocker = tmp_path / "file"
    blocker.write_text("x", encoding="utf-8")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    path = {"folder": tmp_path, "under_a_file": blocker / "out.json",
            "read_only": ro / "out.json"}[where]
    if where == "read_only" and os.access(ro, os.W_OK):
        pytest.skip("running as a user who can write anywhere")
    fake = FakeTrain()
    with pytest.raises((OSError, ValueError)):      # one line, exit 2, from the command line
        sweep(BASE, {"lr": [0.1]}, seeds=(0,), store=path, train_fn=fake)
    assert fake.calls == []
    for argv in (["train", "--profile", "smoke", "--out", str(path)],
                 ["bench", "--width", "4", "--steps", "1", "--out", str(path)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and ("cannot write" in err or "is a folder" in err), err


SWEEP_ONE = """
import sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from mgpu_lib.book.sweep import load_store, sweep
from helpers import FakeTrain
from test_sweep import BASE

class Lockstep(FakeTrain):
    # Point i trains only once the other sweep has reached its point i too, so both have
    # stored every earlier point by then: their appends interleave, every time.
    def __call__(self, config, **options):
        i = len(self.calls)
        Path({sync!r}, f"{name}-{{i}}").touch()
        deadline = time.monotonic() + 60
        while not Path({sync!r}, f"{other}-{{i}}").exists():
            assert time.monotonic() < deadline, "the other sweep never reached point %d" % i
            time.sleep(0.01)
        assert len(load_store({store!r})) >= 2 * i, "an earlier point is missing"
        return super().__call__(config, **options)

sweep(BASE, {{"lr": {lrs}}}, seeds=(0, 1), store={store!r}, train_fn=Lockstep())
"""


@pytest.mark.slow
def test_two_sweeps_writing_one_store_keep_every_point(tmp_path):
    """Before: each sweep rewrote the store from its own memory; 4 of 8 points were kept. The
    two sweeps run in lock step, so their writes overlap in every run of this test."""
    store, sync = str(tmp_path / "shared.jsonl"), tmp_path / "sync"
    sync.mkdir()
    jobs = [subprocess.Popen([sys.executable, "-c", SWEEP_ONE.format(
        tests=str(Path(__file__).parent), lrs=lrs, store=store, sync=str(sync), name=name,
        other=other)]) for lrs, name, other in (([0.1, 0.2], "a", "b"), ([0.3, 0.4], "b", "a"))]
    assert [j.wait(120) for j in jobs] == [0, 0]
    assert sorted((r.config["lr"], r.seed) for r in load_store(store)) == \
        [(lr, s) for lr in (0.1, 0.2, 0.3, 0.4) for s in (0, 1)]


def test_keys_survive_new_trainconfig_fields():
    stored = {**BASE.to_dict(), "field_from_the_future": 1}
    assert point_key(stored) == point_key(BASE)
    assert point_key(BASE) != point_key(BASE.replace(seed=1))


# ---- issue 33: refused before training, never written when nothing is new -------------------

def never(config, **options):
    raise AssertionError(f"trained {config}")


def test_a_sweep_with_nothing_to_train_writes_nothing(monkeypatch):
    """Before: ex1 under `cpu` (every point in the shipped record) failed in a read-only
    install: "cannot write .../mgpu_lib/recorded/ex1_cpu.jsonl: permission denied". Every
    sweep the page runs reads the record and checks, locks and writes nothing."""
    plan = ex1_plan(get_profile("cpu"))
    before = plan.store.read_bytes()

    def no_write(*args, **kwargs):
        raise AssertionError("a store was about to be written")
    monkeypatch.setattr(results, "check_writable", no_write)
    monkeypatch.setattr(results, "append", no_write)
    b, seeds = plan.base, plan.seeds
    for base, vary, use in ((b.replace(num_epochs=max(plan.epochs)), {"num_epochs": plan.epochs},
                             seeds), (b, {"batch_size": plan.batches}, seeds),
                            (b, {"lr": plan.lrs}, seeds), (b, {"nprocs": [2]}, seeds[:1]),
                            (b.replace(batch_size=4 * b.batch_size, lr=linear_scaled_lr(
                                b.lr, b.batch_size, 4 * b.batch_size)),
                             {"warmup_epochs": [0, 1]}, seeds)):
        assert sweep(base, vary, seeds=use, store=plan.store, train_fn=never)
    assert plan.store.read_bytes() == before
    assert not plan.store.with_name(f".{plan.store.name}.lock").exists()


def test_new_points_go_to_the_store_and_a_recorded_one_is_only_read(tmp_path):
    """What a page does with `Ex1Plan.runs`: points found in the shipped record are not
    retrained, new ones are appended to ./runs/, and the record is never written."""
    plan = ex1_plan(get_profile("cpu"))
    assert plan.recorded and plan.runs == Path("runs") / "ex1_cpu.jsonl"
    before, fake = plan.store.read_bytes(), FakeTrain()
    runs = tmp_path / "runs" / "ex1_cpu.jsonl"
    recs = sweep(plan.base, {"lr": [0.1, 0.3]}, seeds=plan.seeds, store=runs,
                 recorded=plan.store, train_fn=fake)
    assert [c.lr for c, _ in fake.calls] == [0.3] * len(plan.seeds) and len(recs) == 2 * len(
        plan.seeds)
    assert plan.store.read_bytes() == before and len(load_store(runs)) == len(plan.seeds)


def test_a_value_or_a_seed_given_twice_is_one_point(tmp_path):
    """Before: `--vary lr=0.05,0.05 --seeds 0,0` planned and reported 2 points and stored 1."""
    fake = FakeTrain()
    recs = sweep(BASE, {"lr": [0.05, 0.05]}, seeds=(0, 0), store=tmp_path / "s.jsonl",
                 train_fn=fake)
    assert len(recs) == 1 and len(fake.calls) == 1 and len(load_store(tmp_path / "s.jsonl")) == 1


@pytest.mark.parametrize("base, vary, error, says", [
    (BASE, {"devices": [1, 2]}, DeviceError, "2 devices requested"),
    (BASE.replace(batch_size=33), {"nprocs": [0, 2]}, ValueError,
     "batch 33, lr 0.1, 2 epochs, seed 0, nprocs 2: batch size 33 does not split evenly"),
    (BASE, {"nprocs": [2], "warmup_epochs": [1]}, ValueError, "warmup with DDP processes"),
])
def test_every_point_is_checked_before_the_first_one_trains(tmp_path, monkeypatch, base, vary,
                                                            error, says):
    """Before: `--vary devices=1,2` on a CPU, or `nprocs=0,2` with an odd batch, trained the
    first point and only then refused the next."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    fake = FakeTrain()
    with pytest.raises(error, match=says) as e:
        sweep(base, vary, seeds=(0,), store=tmp_path / "s.jsonl", train_fn=fake)
    one_line(e)
    assert fake.calls == [] and not (tmp_path / "s.jsonl").exists()
