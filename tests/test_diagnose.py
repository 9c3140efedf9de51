"""'Why is my multi-GPU run slower?': each cause on a mocked machine, and the machine read."""
import pytest
import torch

from mgpu_lib.lab import diagnose
from mgpu_lib.lab.diagnose import Facts, causes, parse_topo, report, unchecked

TWO_4090 = ("NVIDIA GeForce RTX 4090",) * 2
HEALTHY = Facts(devices=("Tesla V100-SXM2-16GB",) * 2, peer={(0, 1): True},
                links={(0, 1): "NV2"}, global_batch=512, strategy="ddp",
                loader_images_per_s=50_000, train_images_per_s=10_000, outside_share=0.1,
                cpu_cores=16, loader_workers=4)

TOPO = """\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV2\tSYS\t0-23\t0
GPU1\tNV2\t X \tPHB\t0-23\t0
GPU2\tSYS\tPHB\t X \t24-47\t1
NIC0\tSYS\tSYS\tPIX

Legend:
  X    = Self
"""


def names(f: Facts) -> set:
    return {c.name for c in causes(f)}


def test_a_healthy_machine_has_no_cause():
    assert names(HEALTHY) == set()
    assert report(HEALTHY)[-1] == "- no likely cause found"


def test_gpus_without_p2p_are_named_with_the_pair():
    f = Facts(devices=TWO_4090, peer={(0, 1): False}, links={(0, 1): "PHB"},
              global_batch=512, strategy="ddp")
    found = {c.name: c for c in causes(f)}
    assert "0-1" in found["no peer-to-peer access"].figure
    assert "PCIe, not NVLink" not in found        # the P2P cause already says it


def test_pcie_links_are_named_with_their_topo_codes():
    f = Facts(devices=("A",) * 3, peer={(0, 1): True, (0, 2): True, (1, 2): True},
              links=parse_topo(TOPO), global_batch=768, strategy="ddp")
    pcie = next(c for c in causes(f) if c.name == "PCIe, not NVLink")
    assert "0-2: SYS" in pcie.figure and "1-2: PHB" in pcie.figure and "0-1" not in pcie.figure


def test_a_small_per_device_batch_is_named_with_its_size():
    f = Facts(devices=("A",) * 16, peer={}, global_batch=256, strategy="ddp")
    small = next(c for c in causes(f) if c.name == "small per-device batch")
    assert small.figure == "16 images per device"
    assert "small per-device batch" not in names(Facts(devices=("A",) * 2, global_batch=256))


def test_a_slow_loader_is_named_with_both_rates():
    f = Facts(devices=("A",) * 2, global_batch=512, strategy="ddp",
              loader_images_per_s=9_000, train_images_per_s=10_000)
    loader = next(c for c in causes(f) if c.name == "input pipeline")
    assert "9,000" in loader.figure and "10,000" in loader.figure
    fast = Facts(devices=("A",) * 2, global_batch=512, strategy="ddp",
                 loader_images_per_s=13_000, train_images_per_s=10_000)
    assert "input pipeline" not in names(fast)


def test_dataparallel_and_an_overhead_heavy_step_and_crowded_cores():
    f = Facts(devices=("A",) * 4, global_batch=1024, strategy="dp", outside_share=0.7,
              cpu_cores=2, loader_workers=4)
    found = {c.name: c for c in causes(f)}
    assert "ms of Python per step on 4 GPUs" in found["DataParallel"].figure
    assert found["step mostly overhead"].figure.startswith("70%")
    assert found["too few cores"].figure == "4 loader workers on 2 core(s)"


def test_on_a_cpu_it_says_what_it_would_check_on_gpus():
    f = Facts(global_batch=256)
    assert "fewer than two GPUs" in names(f)
    todo = " ".join(unchecked(f))
    assert "can_device_access_peer" in todo and "topo" in todo and "training throughput" in todo
    assert all(len(line) <= 88 for line in report(f))


def test_parse_topo_reads_the_matrix_and_skips_nics():
    assert parse_topo(TOPO) == {(0, 1): "NV2", (0, 2): "SYS", (1, 2): "PHB"}
    assert parse_topo("") == {} and parse_topo("No devices were found") == {}


def test_gather_facts_reads_p2p_per_pair_and_the_step_split(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"GPU{i}")
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", lambda i, j: False)
    monkeypatch.setattr(diagnose, "resnet18", lambda width: torch.nn.Linear(1, 1))
    monkeypatch.setattr(torch.nn.Linear, "to", lambda self, d: self)
    monkeypatch.setattr(diagnose, "dp_breakdown", lambda *a, **k: {
        "scatter": 1.0, "replicate": 2.0, "forward": 3.0, "gather": 1.0,
        "backward + reduce": 3.0})
    monkeypatch.setattr(diagnose, "topology", lambda: {(0, 1): "PHB"})
    loader = [(torch.zeros(8, 1), None)] * 5
    f = diagnose.gather_facts(512, loader=loader, train_images_per_s=100.0)
    assert f.devices == ("GPU0", "GPU1") and f.peer == {(0, 1): False}
    assert f.outside_share == pytest.approx(0.4) and f.loader_images_per_s > 0
    assert "no peer-to-peer access" in names(f)


def test_replicate_is_timed_by_torch_benchmark_with_every_device_synchronized(monkeypatch):
    """`replicate` itself needs CUDA; here it is a stand-in that takes 10 ms, and every clock
    reading synchronizes the devices it was given."""
    import time
    from mgpu_lib.lab import anatomy as dataparallel
    calls, synced = [], []
    monkeypatch.setattr(dataparallel, "replicate", lambda net, devices: (calls.append(1),
                                                                          time.sleep(0.01)))
    monkeypatch.setattr(dataparallel, "synchronize", lambda devices: synced.append(devices))
    seconds = dataparallel.replicate_seconds(torch.nn.Linear(2, 2), ["cpu", "cpu"], reps=4)
    assert 0.009 < seconds < 0.05
    assert len(calls) == 4 + 2                      # torch.utils.benchmark warms up twice first
    assert synced and all(d == [torch.device("cpu")] * 2 for d in synced)


def test_the_chapters_loader_alone_is_timed():
    pytest.importorskip("torchvision")
    assert diagnose.chapter_loader_images_per_s(16, batches=3) > 0


def test_a_batch_curve_has_one_row_per_batch_and_steps_in_proportion():
    from mgpu_lib.lab.bench import batch_curve
    rows = batch_curve([8, 16], width=4, steps=1, repeats=1, warmup_steps=1, device="cpu")
    assert [r["batch"] for r in rows] == [8, 16]
    for r in rows:
        assert r["step_s"] == pytest.approx(r["batch"] / r["images_per_second"])
        assert len(r["runs"]) == 1 and r["peak_memory_mb"] is None
