import os
import platform
import subprocess
import sys
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


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_device_counts(bad):
    with pytest.raises(DeviceError):
        resolve_devices(bad)


def test_describe_cpu():
    text = describe_devices([torch.device("cpu")])
    assert text.startswith("CPU: ") and "threads" in text


def test_describe_cpu_names_the_kernels_torch_runs(monkeypatch):
    """Two 2-core EPYCs can differ 3x: the ISA torch dispatches to is part of the name."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert "(AVX2), " in describe_devices([torch.device("cpu")])


def test_the_cpu_is_named_by_py_cpuinfo_not_by_reading_proc(monkeypatch):
    """DESIGN.md: no /proc by hand. The name comes from py-cpuinfo (Linux, macOS, Windows),
    spaces folded; where it finds none, the machine's architecture."""
    for info, name in (({"brand_raw": "  Intel(R) Xeon(R)  CPU @ 2.20GHz "},
                        "Intel(R) Xeon(R) CPU @ 2.20GHz"), ({}, platform.machine())):
        devices.cpu_info.cache_clear()
        monkeypatch.delenv("MGPU_CPU_INFO", raising=False)
        monkeypatch.setattr(devices.cpuinfo, "get_cpu_info", lambda: info)
        assert devices.cpu_name() == name
    devices.cpu_info.cache_clear()


def test_the_processes_a_run_starts_inherit_the_cpu_s_name(monkeypatch):
    """py-cpuinfo takes about a second a process, so a parent (the launcher, the tests) passes
    its answer on in MGPU_CPU_INFO and a child (a DDP rank, a notebook kernel) reads it. A value
    that is not a JSON object is ignored: py-cpuinfo is asked."""
    asked = []
    monkeypatch.setattr(devices.cpuinfo, "get_cpu_info",
                        lambda: asked.append(1) or {"brand_raw": "Asked CPU"})
    for value, name in (('{"brand_raw": "Parent CPU"}', "Parent CPU"), ("not json", "Asked CPU"),
                        ("[1]", "Asked CPU")):
        monkeypatch.setenv("MGPU_CPU_INFO", value)
        devices.cpu_info.cache_clear()
        assert devices.cpu_name() == name
    assert len(asked) == 2
    monkeypatch.setenv("MGPU_CPU_INFO", '{"brand_raw": "Parent CPU"}')
    child = subprocess.run([sys.executable, "-c", "from mgpu_lib.devices import cpu_name; "
                            "print(cpu_name())"], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert child.stdout.strip() == "Parent CPU", child.stderr
    devices.cpu_info.cache_clear()
