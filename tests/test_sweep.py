"""Sweeps: resumable, divergence recorded, epochs derived, and the warmup arithmetic."""
import json
import math

import pytest
import torch

from mgpu_lib.__main__ import main
from mgpu_lib.data import DeviceLoader, synthetic_fashion_mnist
from mgpu_lib.sweep import (WarmupSGD, expand, linear_scaled_lr, load_store, point_key,
                            summarize, sweep, train_warmup, warmup_lr)
from mgpu_lib.train import TrainConfig, TrainResult, train

BASE = TrainConfig(batch_size=32, lr=0.1, num_epochs=2, width=4, train_limit=256, test_limit=64,
                   data_source="synthetic", allow_synthetic=True, profile="test")


def tiny_data(seed: int = 0, batch_size: int = 32):
    """256 synthetic training images: fast, and a fresh shuffle generator for every call."""
    d = synthetic_fashion_mnist(256, 64)
    return (DeviceLoader(d["train_images"], d["train_labels"], batch_size, shuffle=True,
                         seed=seed, source="synthetic"),
            DeviceLoader(d["test_images"], d["test_labels"], 64, shuffle=False))


class FakeTrain:
    """Counts calls; accuracy depends on lr and seed, loss blows up for lr > 10."""

    def __init__(self, fail_on: int = 0):
        self.calls, self.fail_on = [], fail_on

    def __call__(self, config, **options):
        self.calls.append((config, options))
        if len(self.calls) == self.fail_on:
            raise KeyboardInterrupt
        r = TrainResult(config=config.to_dict(), hardware="fake", num_devices=1,
                        data_source="fake", steps_per_epoch=8)
        for e in range(config.num_epochs):
            if config.lr > 10:
                r.train_loss.append(float("nan"))
                r.status = "diverged"
                break
            r.train_loss.append(1.0 / (e + 1))
            r.train_acc.append(0.5)
            r.test_acc.append(round(0.5 + config.lr + 0.01 * config.seed + 0.01 * e, 6))
            r.epoch_seconds.append(1.0 + config.seed)
            r.images_per_second.append(100.0)
        return r


def test_resumed_sweep_skips_stored_points(tmp_path):
    store, fake = tmp_path / "s.json", FakeTrain()
    first = sweep(BASE, {"lr": [0.1, 0.2]}, seeds=(0, 1), store=store, train_fn=fake)
    assert len(fake.calls) == 4 and len(first) == 4
    again = sweep(BASE, {"lr": [0.1, 0.2]}, seeds=(0, 1), store=store, train_fn=fake)
    assert len(fake.calls) == 4                                  # nothing retrained
    assert [r.to_dict() for r in again] == [r.to_dict() for r in first]
    sweep(BASE, {"lr": [0.1, 0.2, 0.4]}, seeds=(0, 1), store=store, train_fn=fake)
    assert [c.lr for c, _ in fake.calls[4:]] == [0.4, 0.4]       # only the new points
    assert len(load_store(store)) == 6


def test_records_carry_config_seed_metrics_hardware_profile(tmp_path):
    (r,) = sweep(BASE, {"lr": [0.2]}, seeds=(3,), store=tmp_path / "s.json", train_fn=FakeTrain())
    assert r.seed == 3 and r.config["lr"] == 0.2 and r.profile == "test"
    assert r.hardware == "fake" and r.status == "ok"
    assert r.metrics["test_acc"] == [0.73, 0.74] and len(r.metrics["epoch_seconds"]) == 2
    assert r.key == point_key(BASE.replace(lr=0.2, seed=3), {})


def test_diverging_lr_is_recorded_not_raised(tmp_path):
    fake = FakeTrain()
    recs = sweep(BASE, {"lr": [0.1, 50.0]}, seeds=(0,), store=tmp_path / "s.json", train_fn=fake)
    assert [r.status for r in recs] == ["ok", "diverged"]
    assert math.isnan(recs[1].final_test_acc)
    rows = summarize(recs, "lr")
    assert rows[1]["diverged"] == 1 and math.isnan(rows[1]["acc_mean"])


def test_real_lr_50_diverges_and_is_stored(tmp_path):
    def real(config, **options):            # the real `train`, on tiny in-memory data
        return train(config, data=tiny_data(config.seed), progress=False)
    (r,) = sweep(BASE.replace(num_epochs=1), {"lr": [50.0]}, seeds=(0,),
                 store=tmp_path / "s.json", train_fn=real)
    assert r.status == "diverged" and r.metrics["test_acc"] == []
    assert load_store(tmp_path / "s.json")[0].status == "diverged"


def test_store_is_valid_json_after_an_interruption(tmp_path):
    store, fake = tmp_path / "s.json", FakeTrain(fail_on=3)
    with pytest.raises(KeyboardInterrupt):
        sweep(BASE, {"lr": [0.1, 0.2, 0.4]}, seeds=(0,), store=store, train_fn=fake)
    data = json.loads(store.read_text())                        # parses: no half-written file
    assert [r["config"]["lr"] for r in data["records"]] == [0.1, 0.2]
    assert not [p for p in tmp_path.iterdir() if p.name != "s.json"]   # no temp files left
    resume = FakeTrain()
    sweep(BASE, {"lr": [0.1, 0.2, 0.4]}, seeds=(0,), store=store, train_fn=resume)
    assert [c.lr for c, _ in resume.calls] == [0.4]             # lost only the point in flight


def test_shorter_epochs_are_derived_from_the_longest_run(tmp_path):
    fake = FakeTrain()
    recs = sweep(BASE, {"num_epochs": [1, 3, 2]}, seeds=(0,), store=tmp_path / "s.json",
                 train_fn=fake)
    assert [c.num_epochs for c, _ in fake.calls] == [3]
    by_epochs = {r.config["num_epochs"]: r for r in recs}
    assert by_epochs[1].metrics["test_acc"] == [0.6]
    assert by_epochs[2].metrics["test_acc"] == [0.6, 0.61]
    assert by_epochs[2].derived_from == by_epochs[3].key
    # a later sweep at 2 epochs and another lr reuses the stored 3-epoch run too
    sweep(BASE, {"lr": [0.1]}, seeds=(0,), store=tmp_path / "s.json", train_fn=fake)
    assert len(fake.calls) == 1


def test_k_epochs_are_the_first_k_of_a_longer_run():
    """The claim that makes derived epochs honest: no schedule, seeded shuffle and weights."""
    short = train(BASE.replace(num_epochs=1), data=tiny_data(), progress=False)
    long = train(BASE.replace(num_epochs=2), data=tiny_data(), progress=False)
    assert short.train_loss[0] == long.train_loss[0]
    assert short.test_acc[0] == long.test_acc[0]


def test_unknown_axis_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="momentum"):
        sweep(BASE, {"momentum": [0.9]}, store=tmp_path / "s.json", train_fn=FakeTrain())


def test_expand_is_the_cartesian_product_with_seeds():
    points = expand(BASE, {"lr": [0.1, 0.2], "warmup_epochs": [0, 1]}, seeds=(0, 1, 2))
    assert len(points) == 12
    assert {(c.lr, o["warmup_epochs"], c.seed) for c, o in points} == {
        (lr, w, s) for lr in (0.1, 0.2) for w in (0, 1) for s in (0, 1, 2)}
    assert point_key(BASE, {"warmup_epochs": 0}) == point_key(BASE, {})
    assert point_key(BASE, {"warmup_epochs": 1}) == point_key(BASE, {"warmup_epochs": 1.0})
    assert point_key(BASE.replace(lr=1)) == point_key(BASE.replace(lr=1.0))


def test_summarize_mean_and_sample_std(tmp_path):
    recs = sweep(BASE, {"lr": [0.1]}, seeds=(0, 2), store=tmp_path / "s.json",
                 train_fn=FakeTrain())
    (row,) = summarize(recs, "lr")
    assert row["acc_mean"] == pytest.approx((0.61 + 0.63) / 2)
    assert row["acc_std"] == pytest.approx(math.sqrt(2 * 0.01 ** 2))   # n - 1 = 1
    assert row["sec_mean"] == pytest.approx(2.0) and row["n"] == 2


def test_linear_scaling_and_warmup_arithmetic():
    assert linear_scaled_lr(0.1, 128, 512) == 0.4        # exactly: it is part of a sweep key
    assert [warmup_lr(s, 0.4, 4) for s in range(6)] == pytest.approx(
        [0.1, 0.2, 0.3, 0.4, 0.4, 0.4])
    assert warmup_lr(0, 0.4, 0) == 0.4


def test_warmup_sgd_follows_the_schedule():
    w = torch.nn.Parameter(torch.zeros(1))
    opt = WarmupSGD([w], lr=0.4, warmup_steps=2)
    steps = []
    for _ in range(3):
        w.grad = torch.ones(1)
        before = w.item()
        opt.step()
        steps.append(before - w.item())
    assert steps == pytest.approx([0.2, 0.4, 0.4])


def test_train_warmup_runs_and_records_warmup():
    r = train_warmup(BASE.replace(num_epochs=1), warmup_epochs=0.5, data=tiny_data())
    assert r.status == "ok" and r.extra["warmup_epochs"] == 0.5 and len(r.test_acc) == 1


def test_cli_sweep_rejects_bad_vary(capsys):
    with pytest.raises(SystemExit) as e:
        main(["sweep", "--vary", "lr=fast", "--store", "x.json"])
    assert e.value.code == 2
    assert "fast" in capsys.readouterr().err


def test_keys_survive_new_trainconfig_fields():
    stored = {**BASE.to_dict(), "field_from_the_future": 1}
    assert point_key(stored) == point_key(BASE)
    assert point_key(BASE) != point_key(BASE.replace(seed=1))
