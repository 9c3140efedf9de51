"""Exercise 2: split arithmetic, the heterogeneous step, its trainer, and the input pipelines."""
import copy
import math
import itertools
import random

import pytest
import torch
from torch import nn

from mgpu_lib import hetero as hetero_mod
from mgpu_lib.hetero import HeteroDataParallel, forward_backward
from mgpu_lib.lab.hetero_bench import measure_throughput
from mgpu_lib.lab.hetero_bench import measure_sync, split_curve
from mgpu_lib.model import init_weights, resnet18
from mgpu_lib.lab.pipeline import augment_batch, data_loader, prefetch
from mgpu_lib.perf.split_time import best_split, predict_hetero_step, shard_grid
from mgpu_lib.split import split_sizes

from helpers import batch, bn_free_model


# ---- split_sizes --------------------------------------------------------------------------

def test_split_one_device_takes_everything():
    assert split_sizes(37, [5.0]) == [37]


def test_split_proportions_by_hand():
    assert split_sizes(128, [300, 100]) == [96, 32]
    assert split_sizes(10, [1, 1, 1]) == [4, 3, 3]          # ties: first device
    assert split_sizes(7, [5, 3, 2]) == [4, 2, 1]           # quotas 3.5, 2.1, 1.4


def test_split_zero_speed_device_gets_nothing():
    assert split_sizes(10, [0, 5]) == [0, 10]
    assert split_sizes(9, [2, 0, 1]) == [6, 0, 3]


def test_split_device_below_one_sample_gets_nothing():
    # Quota 0.32 < 1: plain largest remainder would hand it the leftover sample (10 s of work
    # instead of 4); it gets 0 and the others share its quota.
    assert split_sizes(10, [1, 1, 1, 0.1]) == [4, 3, 3, 0]
    assert split_sizes(0, [1, 2]) == [0, 0]


def _brute_force_best(total, speeds):
    """The smallest slowest-shard time over every integer split of `total` (small cases)."""
    best = float("inf")
    for sizes in itertools.product(range(total + 1), repeat=len(speeds)):
        if sum(sizes) == total:
            best = min(best, predict_hetero_step(speeds, list(sizes), 0.0))
    return best


def test_split_is_optimal_against_brute_force():
    rng = random.Random(0)
    for _ in range(400):
        n = rng.randint(1, 3)
        speeds = [rng.choice([0.0, rng.uniform(0.01, 10), rng.uniform(10, 1000)])
                  for _ in range(n)]
        if not any(speeds):
            speeds[rng.randrange(n)] = 1.0
        total = rng.randint(0, 14)
        sizes = split_sizes(total, speeds)
        assert predict_hetero_step(speeds, sizes, 0.0) <= _brute_force_best(total, speeds) + 1e-12


@pytest.mark.slow
def test_split_property_random_cases():
    rng = random.Random(0)
    for _ in range(500):
        n = rng.randint(1, 6)
        speeds = [rng.choice([0.0, rng.uniform(0.01, 1000)]) for _ in range(n)]
        if not any(speeds):
            speeds[rng.randrange(n)] = 1.0
        total = rng.randint(0, 2000)
        sizes = split_sizes(total, speeds)
        assert sum(sizes) == total and all(k >= 0 for k in sizes)
        assert all(k == 0 for k, s in zip(sizes, speeds) if s == 0)
        for i in range(n):       # a faster device never gets fewer samples
            for j in range(n):
                if speeds[i] > speeds[j]:
                    assert sizes[i] >= sizes[j], (total, speeds, sizes)
        # optimal: one more sample on any device would take at least as long as the slowest
        # shard, so no split of `total` samples can finish sooner.
        mm = predict_hetero_step(speeds, sizes, 0.0)
        assert all((k + 1) / s >= mm - 1e-12 for k, s in zip(sizes, speeds) if s > 0)


# ---- the cost model -------------------------------------------------------------------------

def test_predict_hetero_step_by_hand():
    assert predict_hetero_step([300, 100], [96, 32], 0.1) == pytest.approx(0.32 + 0.1)
    assert predict_hetero_step([300, 100], [64, 64], 0.0) == pytest.approx(0.64)
    assert predict_hetero_step([300, 100], [128, 0], 0.1) == pytest.approx(128 / 300)  # no sync
    assert predict_hetero_step([300, 0], [100, 28], 0.0) == math.inf


def test_best_split_by_hand():
    # GPU 100x the CPU: the CPU's ideal share is 1/101 of 256 = 2.5 samples.
    plan = best_split(256, [1000, 10], sync_s=0.01)
    assert plan.sizes == (254, 2)                      # largest remainder would give (253, 3)
    assert plan.step_s == pytest.approx(0.254 + 0.01)
    assert plan.alone_s == pytest.approx(0.256)
    assert plan.speedup < 1                  # saves 2 ms of compute, pays 10 ms of sync
    assert best_split(10, [1000, 10], 0.01).step_s == 10 / 1000    # CPU earns nothing: no sync
    # Two comparable devices: 96 + 32 finish together in 0.32 s, against 128/300 = 0.427 s.
    assert best_split(128, [300, 100], 0.01).speedup == pytest.approx((128 / 300) / 0.33)


def test_shard_grid_spans_the_ideal():
    grid = shard_grid(256, 3)
    assert grid[0] == 0 and 3 in grid and grid == sorted(set(grid)) and max(grid) <= 256
    assert shard_grid(32, 8)[-1] == 24


# ---- the heterogeneous step -----------------------------------------------------------------

def _full_and_hetero_step(net, train_mode, same_loss=True):
    x, y = batch()
    loss_fn = nn.CrossEntropyLoss()
    ref = copy.deepcopy(net).train(train_mode)
    opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    opt.zero_grad()
    ref_loss = loss_fn(ref(x), y)
    ref_loss.backward()
    opt.step()
    with HeteroDataParallel(copy.deepcopy(net), ["cpu", "cpu"], [3, 1]) as hdp:
        hdp.train(train_mode)
        assert split_sizes(16, hdp.speeds) == [12, 4]
        opt = torch.optim.SGD(hdp.module.parameters(), lr=0.5)
        loss_sum, correct = hdp.step(x, y, opt, loss_fn)
        if same_loss:     # train-mode BN normalizes each shard by its own statistics
            assert loss_sum.item() == pytest.approx(16 * ref_loss.item(), rel=1e-5)
        for p, q in zip(hdp.module.parameters(), hdp.replicas[1].parameters()):
            assert torch.equal(p, q)                   # replicas re-synchronized
        return ref, hdp.module, hdp.replicas[1]


@pytest.mark.parametrize("make", [bn_free_model, lambda: init_weights(resnet18(width=4))],
                         ids=["bn-free", "resnet-eval-bn"])
def test_hetero_step_equals_full_batch_step(make):
    torch.manual_seed(0)
    net = make()
    start = copy.deepcopy(net)
    ref, main, _ = _full_and_hetero_step(net, train_mode=make is bn_free_model)
    for (name, p), q in zip(ref.named_parameters(), main.parameters()):
        assert (p - q).abs().max().item() < 1e-5, name
    assert any((p - q).abs().max() > 1e-4 for p, q in zip(ref.parameters(), start.parameters()))


def test_hetero_step_batchnorm_running_stats_weighted():
    torch.manual_seed(0)
    ref, main, other = _full_and_hetero_step(init_weights(resnet18(width=4)), train_mode=True,
                                           same_loss=False)
    # The first BN layer sees the same conv outputs: the shard-size-weighted mean of the shard
    # means is the full batch's mean, exactly.
    assert (ref[1].running_mean - main[1].running_mean).abs().max().item() < 1e-6
    assert int(main[1].num_batches_tracked) == 1
    for b, c in zip(main.buffers(), other.buffers()):
        assert torch.equal(b, c)


def test_hetero_step_takes_a_split_with_the_main_device_idle():
    x, y = batch()
    with HeteroDataParallel(bn_free_model(), ["cpu", "cpu"], [1, 1]) as hdp:
        opt = torch.optim.SGD(hdp.module.parameters(), lr=0.1)
        hdp.step(x, y, opt, nn.CrossEntropyLoss(), sizes=[0, 16])   # main idle: still a step


@pytest.mark.slow
def test_measurements_leave_the_model_alone():
    """Throughput and sync are measured on copies: weights, BatchNorm statistics and grads of
    the model stay as they were."""
    torch.manual_seed(0)
    net = init_weights(resnet18(width=4))
    before = copy.deepcopy(net.state_dict())
    assert measure_throughput(net, "cpu", 8, steps=2, warmup=1) > 0
    assert measure_throughput(net, "cpu", 8, steps=1, warmup=0, slowdown=3.0) > 0
    with HeteroDataParallel(net, ["cpu", "cpu"], [1, 1]) as hdp:
        assert measure_sync(hdp, steps=2) > 0
        assert all(p.grad is None for p in hdp.module.parameters())
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k]), k


class FakeClock:
    """time for hetero: every perf_counter() reading is 0.25 s after the last; sleeps recorded."""

    def __init__(self):
        self.now, self.slept = 0.0, []

    def perf_counter(self) -> float:
        self.now += 0.25
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


@pytest.mark.parametrize("slowdown, idle", [(1.0, []), (3.0, [0.5]), (1.5, [0.125])])
def test_simulated_throttle_idles_slowdown_minus_one_times_the_work(monkeypatch, slowdown,
                                                                    idle):
    """The SIMULATED slow device works, then idles (slowdown - 1) x as long as it worked (here
    0.25 s of work on the fake clock), so it takes `slowdown` x as long; 1 adds nothing."""
    clock = FakeClock()
    monkeypatch.setattr(hetero_mod, "time", clock)
    x, y = batch()
    loss, correct = forward_backward(bn_free_model(), x, y, nn.CrossEntropyLoss(), slowdown=slowdown)
    assert clock.slept == idle and torch.isfinite(loss)


# ---- the input pipeline ---------------------------------------------------------------------

def test_augment_batch_is_a_shifted_window_maybe_flipped():
    x = torch.rand(8, 1, 28, 28)
    out = augment_batch(x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape
    padded = nn.functional.pad(x, (2, 2, 2, 2))
    for b in range(8):
        windows = [padded[b, :, i:i + 28, j:j + 28] for i in range(5) for j in range(5)]
        assert any(torch.equal(out[b], w) or torch.equal(out[b], w.flip(2)) for w in windows)


def test_data_loader_and_prefetch_keep_the_batches():
    images = torch.randint(0, 256, (40, 28, 28), dtype=torch.uint8)
    labels = torch.arange(40) % 10
    batches = list(data_loader(images, labels, 16, 0, device="cpu"))
    assert [tuple(x.shape) for x, _ in batches] == [(16, 1, 28, 28), (16, 1, 28, 28),
                                                    (8, 1, 28, 28)]
    assert sorted(torch.cat([y for _, y in batches]).tolist()) == sorted(labels.tolist())
    plain = [(torch.full((2,), i), torch.tensor([i])) for i in range(5)]
    assert [int(y) for _, y in prefetch(iter(plain), "cpu")] == [0, 1, 2, 3, 4]

    def broken():
        yield plain[0]
        raise RuntimeError("bad batch")
    with pytest.raises(RuntimeError, match="bad batch"):
        list(prefetch(broken(), "cpu"))


def test_split_curve_predicts_and_measures_each_share():
    x, y = batch()
    with HeteroDataParallel(bn_free_model(), ["cpu", "cpu"], [3, 1]) as hdp:
        opt = torch.optim.SGD(hdp.module.parameters(), lr=0.01)
        rows = split_curve(hdp, x, y, opt, nn.CrossEntropyLoss(), [300.0, 100.0], 0.01,
                           [0, 4, 8], steps=1)
    assert [r["share"] for r in rows] == [0, 4, 8]
    for r in rows:
        assert r["measured_s"] > 0
        assert r["predicted_s"] == pytest.approx(
            predict_hetero_step([300.0, 100.0], [16 - r["share"], r["share"]], 0.01))
