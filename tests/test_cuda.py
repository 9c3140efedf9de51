"""What only a CUDA GPU can show: run by `tools/gpu_check.py` (`pytest -m cuda tests/test_cuda.py`).

Every test here is marked `cuda` and skipped on a machine without CUDA, so `make test` on a CPU
reports them as skipped. The data are synthetic: these tests check mechanics, not accuracy, and
need neither the network nor a copy of Fashion-MNIST.
"""
import copy

import pytest
import torch
from torch import nn

from mgpu_lib.lab.anatomy import dp_breakdown
from mgpu_lib.lab.launcher import launch
from mgpu_lib.hetero import HeteroDataParallel
from mgpu_lib.config import REFERENCE, resolve_switches
from mgpu_lib.lab.bench import native_bf16
from mgpu_lib.training import TrainConfig, make_model, train

from helpers import batch, bn_free_model

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# A run of seconds: width 8, 512 synthetic training images, one epoch.
TINY = TrainConfig(devices=1, width=8, batch_size=64, num_epochs=1, train_limit=512,
                   test_limit=128, data_source="synthetic")


def test_dataparallel_with_one_device_moves_the_module_to_it():
    """DataParallel.__init__ calls `module.to(device)` when given one device id: why the
    chapter's 1-GPU run works although it never moves the network itself."""
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.Linear(4 * 26 * 26, 10))
    assert {p.device.type for p in net.parameters()} == {"cpu"}
    dp = nn.DataParallel(net, device_ids=[0])
    assert {p.device for p in dp.module.parameters()} == {torch.device("cuda:0")}
    out = dp(torch.rand(8, 1, 28, 28, device="cuda:0"))
    assert out.shape == (8, 10) and out.device == torch.device("cuda:0")


def test_dataparallel_with_two_device_ids_raises_when_the_module_stayed_on_the_cpu():
    """The chapter's 2-GPU run without the 1-GPU run before it (d2l-en issue 2461): with more
    than one device id, `DataParallel.__init__` leaves the module where it is, and `forward`
    refuses parameters that are not on device_ids[0]. Two ids of one GPU take the same branch,
    so one GPU shows it; the next test uses two GPUs where they exist."""
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.Linear(4 * 26 * 26, 10))
    dp = nn.DataParallel(net, device_ids=[0, 0])
    assert {p.device.type for p in dp.module.parameters()} == {"cpu"}
    with pytest.raises(RuntimeError, match="parameters and buffers"):
        dp(torch.rand(8, 1, 28, 28, device="cuda:0"))
    dp.module.to("cuda:0")            # what mgpu_lib.training.train does before wrapping
    assert dp(torch.rand(8, 1, 28, 28, device="cuda:0")).shape == (8, 10)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_dataparallel_over_two_gpus_raises_when_the_module_stayed_on_the_cpu():
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.Linear(4 * 26 * 26, 10))
    dp = nn.DataParallel(net, device_ids=[0, 1])
    with pytest.raises(RuntimeError, match="parameters and buffers"):
        dp(torch.rand(8, 1, 28, 28, device="cuda:0"))


def test_auto_picks_a_reduced_precision_only_where_a_record_measured_it_faster():
    from mgpu_lib.devices import measured_precision
    device = torch.device("cuda:0")
    native = torch.cuda.get_device_capability(device) >= (8, 0)
    assert native_bf16(device) == native
    chosen = resolve_switches(TrainConfig(), device)
    assert chosen.bf16 == (native and measured_precision(device, 64) == "bf16")
    assert chosen.tf32 == native
    assert resolve_switches(TrainConfig(bf16=False), device).bf16 is False
    assert resolve_switches(TrainConfig(fast=False), device) == REFERENCE


def test_cudnn_benchmark_is_on_during_a_fast_run_and_restored_after():
    before = torch.backends.cudnn.benchmark
    seen = []
    result = train(TINY, progress=False,
                   on_epoch=lambda r: seen.append(torch.backends.cudnn.benchmark))
    assert result.status == "ok" and seen == [True]
    assert result.extra["switches"]["cudnn_benchmark"] is True
    assert torch.backends.cudnn.benchmark == before


def test_one_process_nccl_ddp_run():
    result = launch(TINY, 1, backend="nccl", timeout_s=240)
    assert result.status == "ok"
    assert result.extra["backend"] == "nccl" and result.extra["world_size"] == 1
    assert len(result.test_acc) == 1 and 0.0 <= result.test_acc[0] <= 1.0


def test_cuda_plus_cpu_hetero_step_equals_the_full_batch_step(monkeypatch):
    # TF32 on the GPU would differ from the CPU's fp32 by more than the tolerance
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        _hetero_step_equals_full_batch_step()
    finally:
        torch.set_float32_matmul_precision(precision)


def _hetero_step_equals_full_batch_step():
    net = bn_free_model(seed=0)
    x, y = batch(32)
    loss_fn = nn.CrossEntropyLoss()
    ref = copy.deepcopy(net).to("cuda:0")
    opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    loss_fn(ref(x.to("cuda:0")), y.to("cuda:0")).backward()
    opt.step()
    with HeteroDataParallel(copy.deepcopy(net), ["cuda:0", "cpu"], [3, 1]) as hdp:
        opt = torch.optim.SGD(hdp.module.parameters(), lr=0.5)
        hdp.step(x, y, opt, loss_fn)
        for (name, p), q, c in zip(ref.named_parameters(), hdp.module.parameters(),
                                   hdp.replicas[1].parameters()):
            assert q.device == torch.device("cuda:0") and c.device.type == "cpu"
            assert (p - q).abs().max().item() < 1e-4, name
            assert torch.equal(q.cpu(), c), name            # the CPU replica got the weights
    assert any((p.cpu() - q).abs().max() > 1e-3
               for p, q in zip(ref.parameters(), net.parameters()))   # the step moved them


def test_dp_breakdown_on_one_gpu_times_every_phase():
    net = make_model(TrainConfig(width=8), "cuda:0")
    phases = dp_breakdown(net, [torch.device("cuda:0")], batch_size=64, steps=2)
    assert set(phases) == {"scatter", "replicate", "forward", "gather", "backward + reduce"}
    assert all(v > 0 for v in phases.values())
