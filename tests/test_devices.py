import platform
from pathlib import Path

import pytest
import torch

from mgpu_lib import devices
from mgpu_lib.devices import DeviceError, describe_devices, resolve_devices, try_all_gpus

ROOT = Path(__file__).resolve().parent.parent


def test_try_all_gpus_never_empty():
    assert len(try_all_gpus()) >= 1


def test_cpu_only_machine(monkeypatch):
    monkeypatch.setattr(devices, "num_gpus", lambda: 0)
    monkeypatch.setattr(devices, "_mps_available", lambda: False)
    assert try_all_gpus() == [torch.device("cpu")]
    assert resolve_devices(None) == [torch.device("cpu")]
    assert resolve_devices(1) == [torch.device("cpu")]
    with pytest.raises(DeviceError, match=r"2 devices requested .* no GPU"):
        resolve_devices(2)


def test_too_many_gpus_names_what_exists(monkeypatch):
    monkeypatch.setattr(devices, "num_gpus", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    assert resolve_devices(None) == [torch.device("cuda:0"), torch.device("cuda:1")]
    with pytest.raises(DeviceError, match=r"16 devices requested but this machine has 2 CUDA "
                                          r"GPUs \(Fake GPU\)"):
        resolve_devices(16)


def test_describe_cpu():
    text = describe_devices([torch.device("cpu")])
    assert text.startswith("CPU (") and "threads" in text


def test_describe_cpu_names_the_kernels_torch_runs(monkeypatch):
    """Two 2-core EPYCs can differ 3x: the ISA torch dispatches to is part of the name."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert "(AVX2), " in describe_devices([torch.device("cpu")])


def test_records_and_banners_name_the_cpu_by_py_cpuinfo_not_by_reading_proc(monkeypatch):
    """DESIGN.md: no /proc by hand. The core says 'CPU (AVX2)'; a record's header and the
    banner add the brand py-cpuinfo gives (spaces folded; where it finds none, the machine's
    architecture). The core never asks py-cpuinfo (a second a process, issue 50)."""
    from mgpu_lib.lab import files
    for info, name in (({"brand_raw": "  Intel(R) Xeon(R)  CPU @ 2.20GHz "},
                        "Intel(R) Xeon(R) CPU @ 2.20GHz"), ({}, platform.machine())):
        files.cpu_info.cache_clear()
        monkeypatch.setattr(files.cpuinfo, "get_cpu_info", lambda: info)
        assert files.cpu_name() == name
        assert files.with_cpu_name("CPU (AVX2), 2 threads") == f"CPU: {name} (AVX2), 2 threads"
        header = files.record_header(hardware="CPU (AVX2), 2 threads", profile=None, config={})
        assert header["hardware"] == f"CPU: {name} (AVX2), 2 threads"
    files.cpu_info.cache_clear()
    assert "cpuinfo" not in (ROOT / "mgpu_lib" / "devices.py").read_text(encoding="utf-8")
