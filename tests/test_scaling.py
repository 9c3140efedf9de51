"""The step-time model: hand-computed cases, and the shapes every reader relies on."""
import math
from dataclasses import replace

import pytest

from mgpu_lib.perf import evidence
from mgpu_lib.perf.runtime import Job, gpu_band, step_seconds, workload
from mgpu_lib.perf.scaling import (DEVICES, LINKS, NO_P2P, RESNET18, LinkSpec, Overheads,
                                   allreduce_bytes, conv_peak_tflops, dp_python_s, loader_rate,
                                   pair_link, predict_epoch_time, predict_step_time,
                                   ring_allreduce_s, spec_for_name)

K80 = DEVICES["K80 (one GK210 die)"]
PCIE3 = LINKS["PCIe gen3 x16"]
NO_LATENCY = LinkSpec("ideal 16 GB/s", 16.0, 0.0, "test")


def test_workload_is_the_chapters_resnet18():
    assert RESNET18.params == 11_175_818
    assert RESNET18.grad_bytes == pytest.approx(44.70e6, rel=1e-3)      # "45 MB" of fp32
    assert RESNET18.train_flops == pytest.approx(3 * 0.9116e9)


def test_ring_allreduce_45mb_8_devices_16gbs_is_4_9_ms():
    # 2 * 7/8 * 44.7e6 B / 16e9 B/s = 4.889 ms
    assert ring_allreduce_s(RESNET18.grad_bytes, 8, 16.0) == pytest.approx(4.889e-3, rel=1e-3)
    # latency adds 2(n-1) hops: 14 x 5 us
    assert ring_allreduce_s(RESNET18.grad_bytes, 8, 16.0, 5e-6) == pytest.approx(
        4.889e-3 + 70e-6, rel=1e-3)
    assert ring_allreduce_s(1e9, 1, 16.0, 1.0) == 0.0


def test_ddp_step_hand_computed():
    o = Overheads(efficiency=0.4, half_batch=16, step_s=2e-3, overlap=0.0)
    t = predict_step_time(8, 256, K80, NO_LATENCY, "ddp", overheads=o)
    rate = 4.37e12 * 0.4 / (3 * 0.9116e9)                 # 639.2 images/s per die
    assert t.compute == pytest.approx((32 + 16) / rate)    # 75.1 ms for 32 images
    assert t.compute == pytest.approx(75.09e-3, rel=1e-3)
    assert t.communication == pytest.approx(4.889e-3, rel=1e-3)   # nothing hidden
    optimizer = 3 * 44.70e6 / 240e9                         # 0.559 ms of memory traffic
    assert t.overhead == pytest.approx(2e-3 + optimizer, rel=1e-3)
    assert t.total == pytest.approx(t.compute + t.communication + t.overhead)


def test_ddp_overlap_hides_at_most_the_stated_share_of_backward():
    o = Overheads(overlap=0.5, half_batch=0)
    t = predict_step_time(8, 256, K80, NO_LATENCY, "ddp", overheads=o)
    backward = t.compute * 2 / 3
    assert t.hidden == pytest.approx(min(4.889e-3, 0.5 * backward), rel=1e-3)
    assert t.communication + t.hidden == pytest.approx(4.889e-3, rel=1e-3)
    # a tiny batch leaves little backward to hide behind
    small = predict_step_time(8, 8, K80, NO_LATENCY, "ddp", overheads=o)
    assert small.hidden == pytest.approx(0.5 * small.compute * 2 / 3)
    assert small.communication > 0


def test_dp_step_hand_computed_two_devices():
    o = Overheads(step_s=0.0, thread_s=1e-3, tensor_s=10e-6)
    t = predict_step_time(2, 256, K80, NO_LATENCY, "dp", overheads=o)
    g = 44.70e6 / 16e9                                     # 2.79 ms per model copy
    scatter_gather = 128 * (3136 + 40) / 16e9
    assert t.communication == pytest.approx(g + g + scatter_gather, rel=1e-3)
    python = 2 * (1e-3 + 127 * 10e-6)                      # 2 replicas of 127 tensors
    assert t.overhead == pytest.approx(python + 3 * 44.70e6 / 240e9, rel=1e-3)


def test_dp_collectives_carry_one_copy_each_way_whatever_n():
    """replicate() broadcasts with comm.broadcast_coalesced and the gradients come back through
    comm.reduce_add_coalesced: pipelined, so GPU 0's link carries about one copy each way."""
    g = 44.70e6 / 16e9
    for n in (2, 4, 16):
        t = predict_step_time(n, 256, K80, NO_LATENCY, "dp", overheads=Overheads())
        scatter_gather = (n - 1) * (256 / n) * (3136 + 40) / 16e9
        assert t.communication == pytest.approx(2 * g + scatter_gather, rel=1e-3)
        assert t.hidden == 0                               # nothing overlaps with backward
    assert allreduce_bytes(1000, 16)["dp_gpu0"] == 4000.0  # one copy, not 15


def test_one_device_dp_equals_ddp():
    a = predict_step_time(1, 256, K80, PCIE3, "dp")
    b = predict_step_time(1, 256, K80, PCIE3, "ddp")
    assert a.total == pytest.approx(b.total)
    assert a.communication == 0 and b.communication == 0


@pytest.mark.parametrize("strategy", ["dp", "ddp"])
def test_efficiency_falls_as_devices_grow_at_fixed_global_batch(strategy):
    t1 = predict_epoch_time(1, 256, 60_000, K80, PCIE3, strategy)
    effs = [t1 / (n * predict_epoch_time(n, 256, 60_000, K80, PCIE3, strategy))
            for n in range(1, 17)]
    assert effs[0] == pytest.approx(1.0)
    assert all(b < a for a, b in zip(effs, effs[1:]))
    assert effs[-1] < 0.8


def test_dp_never_faster_than_ddp_for_two_or_more_devices():
    for spec in DEVICES.values():
        for link in LINKS.values():
            for batch in (16, 64, 256, 1024, 4096):
                for n in range(2, 17):
                    dp = predict_step_time(n, batch, spec, link, "dp").total
                    ddp = predict_step_time(n, batch, spec, link, "ddp").total
                    assert dp > ddp, (spec.name, link.name, batch, n)


def test_epoch_time_counts_the_short_last_step():
    full = predict_step_time(1, 256, K80, PCIE3).total
    short = predict_step_time(1, 60_000 - 234 * 256, K80, PCIE3).total
    assert predict_epoch_time(1, 256, 60_000, K80, PCIE3) == pytest.approx(234 * full + short)


def test_specs_are_sourced_and_k80_has_no_bf16():
    assert K80.fp32_tflops == pytest.approx(8.73 / 2, abs=0.01)
    assert K80.tensor_tflops is None and "no bf16" in K80.source
    assert DEVICES["A100 SXM4 80GB"].tensor_dtype == "bf16"
    assert DEVICES["T4"].tensor_dtype == "fp16"         # Turing has no bf16
    for spec in list(DEVICES.values()) + list(LINKS.values()):
        assert any(w in spec.source for w in ("datasheet", "specification", "whitepaper",
                                              "github.com")), spec.name
    assert PCIE3.gbs == 16.0 and LINKS["PCIe gen4 x16"].gbs == 32.0


def test_one_image_per_device_is_a_finite_step():
    assert math.isfinite(predict_step_time(16, 16, K80, PCIE3, "dp").total)


def test_spec_for_name_matches_the_model_in_a_device_name():
    assert spec_for_name("NVIDIA H200") is DEVICES["H200 SXM"]
    assert spec_for_name("Tesla T4") is DEVICES["T4"]
    assert spec_for_name("NVIDIA GeForce RTX 4090") is DEVICES["RTX 4090"]
    assert spec_for_name("NVIDIA GeForce RTX 3090") is None   # "RTX" alone names no chip
    assert spec_for_name("Tesla V100-SXM2-16GB") is DEVICES["V100 SXM2"]


def test_dataparallel_python_grows_with_tensors_and_devices():
    o = Overheads(thread_s=1e-3, tensor_s=20e-6)
    assert dp_python_s(RESNET18, 1, o) == 0.0             # one device: no replicas
    assert dp_python_s(RESNET18, 2, o) == pytest.approx(2 * (1e-3 + 127 * 20e-6))
    assert dp_python_s(RESNET18, 16, o) == pytest.approx(8 * dp_python_s(RESNET18, 2, o))
    fewer = replace(RESNET18, tensors=10)
    assert dp_python_s(fewer, 4, o) < dp_python_s(RESNET18, 4, o)


def test_without_p2p_dataparallel_on_two_4090s_is_slower_than_one():
    """d2l-neu's box: the copies go through host memory at a couple of GB/s, and 2 GPUs lose;
    the same GPUs over NVLink would win."""
    g4090, staged = DEVICES["RTX 4090"], LINKS[NO_P2P]
    one = predict_epoch_time(1, 256, 60_000, g4090, staged, "dp")
    two = predict_epoch_time(2, 512, 60_000, g4090, staged, "dp")
    nvlink = predict_epoch_time(2, 512, 60_000, g4090, pair_link(g4090, topo="NV4"), "dp")
    assert two > one > nvlink


def test_the_loader_bounds_an_epoch_and_never_shortens_it():
    h200, nv = DEVICES["H200 SXM"], LINKS["NVLink 4 (H100/H200, NVSwitch)"]
    free = predict_epoch_time(2, 512, 60_000, h200, nv, "dp")
    slow = predict_epoch_time(2, 512, 60_000, h200, nv, "dp", loader_images_per_s=1000.0)
    fast = predict_epoch_time(2, 512, 60_000, h200, nv, "dp", loader_images_per_s=1e9)
    assert slow == pytest.approx(60.0) and fast == pytest.approx(free)
    assert loader_rate(28, 4) == pytest.approx(2 * loader_rate(28, 2))
    assert loader_rate(64) < loader_rate(28)


def epoch_s(spec, n: int, batch: int) -> float:
    """The pages' predictor (`runtime.step_seconds`) for one epoch of Fashion-MNIST."""
    full, rest = divmod(60_000, batch)
    return full * step_seconds(spec, batch, devices=n) + (
        step_seconds(spec, rest, devices=n) if rest else 0.0)


def test_runtime_and_evidence_take_one_link_and_agree_on_the_direction():
    """Before: `runtime` put every multi-GPU job on PCIe gen3, so it had 2 RTX 4090s beat 1
    (5.3 against 7.1 s/epoch) while `evidence`, over the staged link, had them lose."""
    g4090, v100 = DEVICES["RTX 4090"], DEVICES["V100 SXM2"]
    assert pair_link(g4090).name == NO_P2P and pair_link(v100).gbs == 25.0
    assert epoch_s(g4090, 2, 512) > epoch_s(g4090, 1, 256)       # DataParallel loses
    assert epoch_s(v100, 2, 512) < epoch_s(v100, 1, 256)         # and wins on NVLink
    for spec in (g4090, v100):        # evidence's middle goes the same way as runtime's
        two, one = (evidence.band(evidence.epoch_time(n, b, spec), spec)[1]
                    for n, b in ((2, 512), (1, 256)))
        assert (two > one) == (epoch_s(spec, 2, 512) > epoch_s(spec, 1, 256))
    assert evidence.predicted_faster(evidence.epoch_time(2, 512, v100), evidence.epoch_time(
        1, 256, v100), v100, ("2 GPUs", "1 GPU")) == "2 GPUs faster"    # bands apart


def test_a_link_follows_p2p_and_the_topology_code():
    v100, g4090 = DEVICES["V100 SXM2"], DEVICES["RTX 4090"]
    assert pair_link(v100, topo="NV2").gbs == 50.0
    assert pair_link(v100, topo="SYS") is LINKS["PCIe gen3 x16"]
    assert pair_link(v100, p2p=False).name == NO_P2P
    assert pair_link(g4090, p2p=True) is LINKS["PCIe gen4 x16"]      # P2P switched on
    # a V100 pair of a p3 / DGX-1 shares one of its six links, not all of them
    assert "whitepaper" in LINKS["NVLink 2, 1 link (V100 pair)"].source


def test_ampere_and_newer_run_fp32_convolutions_in_tf32():
    """Before: an A100 was scaled from its FP32 cores (19.5 TFLOP/s) and predicted slower than
    a V100 for this chapter (16.0 against 13.9 s/epoch)."""
    a100, v100 = DEVICES["A100 SXM4 80GB"], DEVICES["V100 SXM2"]
    assert conv_peak_tflops(a100) == 156.0 and "TF32" in a100.source
    assert conv_peak_tflops(v100) == v100.fp32_tflops and "no TF32" in v100.source
    assert conv_peak_tflops(DEVICES["RTX 4090"]) == 82.6
    assert epoch_s(a100, 1, 256) < epoch_s(v100, 1, 256)
    chapter = [Job("chapter", 1, 64, 256, 10, 60_000, 10_000)]
    assert gpu_band(chapter, a100)[1] < gpu_band(chapter, v100)[0]     # at every corner


def test_the_break_even_slowdown_is_solved_not_read_off_a_grid():
    """Issue 36: ex2 read "about 8" off a grid of slowdowns; the crossing, solved on the
    whole-sample split, is about 9.3 for the chapter's batch beside one V100."""
    from mgpu_lib.perf.evidence import workload
    from mgpu_lib.perf.split_time import best_split, break_even_slowdown
    v100, w = DEVICES["V100 SXM2"], workload(64)
    speed = 256 / step_seconds(v100, 256)
    sync = 2 * w.bytes_per_param * w.params / (LINKS[v100.pcie].gbs * 1e9)
    k = break_even_slowdown(256, speed, sync)
    assert k == pytest.approx(9.3, abs=0.1)
    assert best_split(256, [speed, speed / (k * 0.999)], sync).speedup > 1
    assert best_split(256, [speed, speed / (k * 1.001)], sync).speedup <= 1
    # the continuous split's closed form, alone / sync - 1, is close
    assert k == pytest.approx(256 / speed / sync - 1, rel=0.05)
    assert break_even_slowdown(256, speed, 1.0) is None          # sync outweighs everything
    assert break_even_slowdown(256, speed, 0.0) == pytest.approx(256, rel=1e-6)
