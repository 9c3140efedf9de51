"""The platforms this machine is not: Windows and macOS simulated on Linux, and Apple Silicon's
MPS mocked. Each simulation takes away what the other platform lacks (`fcntl`, /proc, libc,
`preexec_fn`, a `terminate` that lets torchrun stop its workers) and runs the code that needs it.
The real platforms run the fast tests in CI (.github/workflows/ci.yml)."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
import torch
import torch._dynamo  # noqa: F401  (imported before MPS is mocked: it wraps mps.is_available)
from torch import nn

from mgpu_lib import config as switches, ddp, devices
from mgpu_lib.lab import launcher
from mgpu_lib.book.pages import setup_page

from ddp_helpers import alive, gone, ranks_below, tiny, wait_for

REPO = Path(__file__).resolve().parent.parent

# Run first in a child Python: no fcntl (Windows), and for mgpu_lib's own code no /proc (macOS,
# Windows) and no libc.so.6 (macOS's is libSystem, Windows has none). psutil's Linux backend
# stands in for its macOS and Windows ones, which read no /proc.
NOT_LINUX = textwrap.dedent("""
    import builtins, ctypes, io, os, pathlib, sys, sysconfig
    import psutil                       # before the blocks: psutil's Linux backend needs them
    sys.modules["fcntl"] = None
    sys.modules["resource"] = None      # Windows has neither
    del os.mkfifo                       # nor FIFOs
    # /proc and libc are taken from mgpu_lib's code only: torch and psutil have their own
    # per-platform branches (torch loads libc.so.6 on Linux only), which this cannot switch.
    STDLIB = sysconfig.get_paths()["stdlib"]
    def _from_mgpu_lib():
        frame = sys._getframe(2)
        while frame and frame.f_code.co_filename.startswith((STDLIB, "<")):
            frame = frame.f_back
        return bool(frame) and os.sep + "mgpu_lib" + os.sep in frame.f_code.co_filename
    def _no_proc(path):
        p = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else ""
        if (p == "/proc" or p.startswith("/proc/")) and _from_mgpu_lib():
            raise FileNotFoundError(2, "no /proc on this platform", p)
    def _guard(f):
        def guarded(path, *a, **kw):
            _no_proc(path)
            return f(path, *a, **kw)
        return guarded
    builtins.open = io.open = _guard(builtins.open)
    os.listdir, os.scandir, os.stat = _guard(os.listdir), _guard(os.scandir), _guard(os.stat)
    _CDLL = ctypes.CDLL
    class CDLL(_CDLL):
        def __init__(self, name, *a, **kw):
            if name and "libc" in str(name) and _from_mgpu_lib():
                raise OSError(f"{name}: cannot open shared object file")
            super().__init__(name, *a, **kw)
    ctypes.CDLL = CDLL
""")


def _run(code: str, timeout: int = 300, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NOT_LINUX + textwrap.dedent(code)], cwd=REPO,
                          env=dict(os.environ, **env), capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_every_module_imports_and_a_page_sets_up_and_trains_without_linux():
    """Before: `import mgpu_lib.book.pages` raised ModuleNotFoundError: fcntl (results.py);
    then `python -m mgpu_lib` raised one for `resource` (bench.py, issue 32)."""
    run = _run("""
        import contextlib, importlib, io, pkgutil, mgpu_lib
        from mgpu_lib.book.cli import main
        with contextlib.redirect_stdout(io.StringIO()) as shown:
            try:
                main(["--help"])
            except SystemExit as e:
                assert e.code == 0 and "train" in shown.getvalue(), e.code
        names = [m.name for m in pkgutil.walk_packages(mgpu_lib.__path__, "mgpu_lib.")
                 if not m.name.endswith("__main__")]
        for name in names:
            importlib.import_module(name)
        from mgpu_lib.book.pages import setup_page
        profile, lines = setup_page("01_network")
        code = main(["train", "--profile", "smoke", "--epochs", "1", "--width", "4",
                     "--data-source", "synthetic"])
        print("modules", len(names), "profile", profile.name, "train", code)
        """, MGPU_PROFILE="smoke")
    assert run.returncode == 0, run.stderr[-3000:]
    last = run.stdout.strip().splitlines()[-1].split()
    assert last[0] == "modules" and int(last[1]) > 15, run.stdout
    assert last[2:] == ["profile", "smoke", "train", "0"], run.stdout


class _Windows:
    """The `os` module as the launcher would see it on Windows."""
    name = "nt"

    def __getattr__(self, attr):
        return getattr(os, attr)


def test_the_agent_starts_without_preexec_fn_on_windows(monkeypatch):
    """Before: Popen(..., preexec_fn=...) raised ValueError on Windows before torchrun ran.
    Now no platform needs one: the agent watches its parent itself."""
    real = subprocess.Popen
    seen = {}

    def windows_popen(*args, **kw):        # what Windows' Popen accepts, then Linux's
        if kw.get("preexec_fn") is not None:
            raise ValueError("preexec_fn is not supported on Windows platforms")
        seen.update(kw)
        kw.pop("creationflags", None)
        return real(*args, **kw)

    monkeypatch.setattr(launcher, "os", _Windows())      # supervise's view only: pytest's
    monkeypatch.setattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0x200, raising=False)
    monkeypatch.setattr(subprocess, "Popen", windows_popen)
    ended = launcher.supervise([sys.executable, "-c", "print('rank 0: hello')"],
                                dict(os.environ), 60, log=seen.setdefault("log", []).append)
    assert ended.code == 0 and seen["log"] == ["hello"]
    assert seen["creationflags"] == 0x200 and not seen.get("start_new_session")


@pytest.mark.slow
def test_a_stopped_ddp_job_leaves_nothing_behind_without_proc(tmp_path):
    """Windows' `terminate` ends the agent at once (TerminateProcess), so it cannot stop its
    ranks; and there is no /proc to find them. A healthy rank then dies with the agent's store,
    but a hung one does not: psutil's tree must find and kill it.
    Before: the workers were found under /proc only, and the hung one was left behind."""
    run = _run(f"""
        import _thread, json, signal, subprocess, time, psutil
        from mgpu_lib.lab import launcher
        sys.path.insert(0, {str(REPO / "tests")!r})
        from ddp_helpers import tiny
        subprocess.Popen.terminate = subprocess.Popen.kill
        seen = []
        def log(line):
            if not seen:
                seen.extend(p.pid for p in psutil.Process().children(recursive=True)
                            if "RANK" in p.environ())
                print(json.dumps(seen), flush=True)
                os.kill(seen[-1], signal.SIGSTOP)  # a hung rank: it cannot exit by itself
                _thread.interrupt_main()          # Ctrl-C while the job runs
        try:
            launcher.launch(tiny(num_epochs=50), 2, timeout_s=240, log=log)
        except KeyboardInterrupt:       # which workers outlived the stop (none should)
            def running(pid):           # a killed process may take a moment to go
                try:
                    return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                except psutil.NoSuchProcess:
                    return False
            for _ in range(50):
                if any(running(p) for p in seen):
                    time.sleep(0.1)
            print(json.dumps([p for p in seen if running(p)]), flush=True)
        """, timeout=300, TMPDIR=str(tmp_path))
    lines = run.stdout.strip().splitlines()
    pids = json.loads(lines[0]) if lines and lines[0].startswith("[") else []
    try:
        assert len(pids) == 2 and len(lines) == 2, run.stdout + run.stderr[-3000:]
        assert json.loads(lines[1]) == [], f"workers left running after the stop: {lines[1]}"
        assert not list(tmp_path.glob("mgpu-ddp-*"))
    finally:                            # never leave a worker behind
        for pid in pids:
            if alive(pid):
                psutil.Process(pid).kill()


def test_stop_terminates_the_tree_then_kills_what_ignores_it():
    """`stop`: torchrun first, then each worker below it; one that ignores SIGTERM is killed."""
    stubborn = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('ready', flush=True); time.sleep(600)")
    parent = ("import subprocess, sys, time; "
              f"subprocess.Popen([sys.executable, '-c', {stubborn!r}]); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", parent], **launcher.popen_options())
    try:
        assert wait_for(lambda: len(launcher.tree(proc.pid)) == 1, 30)
        child = launcher.tree(proc.pid)[0]
        launcher.stop(proc)
        # a SIGKILL is delivered, not awaited: the orphan may take a moment to be gone
        assert proc.poll() is not None and wait_for(lambda: not alive(child.pid), 5)
    finally:
        launcher.stop_all(launcher.tree(proc.pid) + [psutil.Process(proc.pid)]
                           if alive(proc.pid) else [])


@pytest.mark.slow
def test_a_killed_parent_takes_the_job_and_its_folder_with_it(tmp_path):
    """A notebook kernel killed outright (SIGKILL) sends nothing: the agent sees its parent gone,
    stops its ranks as on SIGTERM and removes the job's folder, on any platform. Before:
    Linux's parent-death signal (`prctl`, Linux only) stopped torchrun; the folder stayed."""
    child = textwrap.dedent("""
        import os
        from mgpu_lib.lab import launcher
        with launcher.job_folder("mgpu-test-") as job:
            launcher.run_ranks(["-c", "import time; time.sleep(600)"], 2, job,
                               env=dict(os.environ), timeout_s=600)
        """)
    parent = subprocess.Popen([sys.executable, "-c", child], cwd=REPO,
                              env=dict(os.environ, TMPDIR=str(tmp_path)))
    started = []
    try:
        assert wait_for(lambda: len(ranks_below(parent.pid)) == 2, 120), "no ranks started"
        started = launcher.tree(parent.pid)
        parent.kill()
        parent.wait()
        assert gone(started), "the job outlived its parent"
        assert wait_for(lambda: not list(tmp_path.glob("mgpu-test-*")), 30)
    finally:
        parent.kill()
        launcher.stop_all([p for p in started if alive(p.pid)])


# ---- Apple Silicon: MPS mocked -----------------------------------------------------------------

@pytest.fixture
def mac(monkeypatch):
    """A Mac with Apple Silicon: MPS, no CUDA."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)


def test_apple_silicon_pages_see_one_mps_device_in_fp32(mac):
    mps = torch.device("mps")
    assert devices.try_all_gpus() == [mps] and devices.resolve_devices(None) == [mps]
    with pytest.raises(devices.DeviceError, match="1 Apple MPS device and no CUDA GPU"):
        devices.resolve_devices(2)
    # no autocast on MPS: neither bf16 nor fp16 with a GradScaler; no cudnn; NCHW
    assert devices.autocast_dtype(mps) is None
    chosen = switches.resolve_switches(tiny(width=64), mps)
    assert not (chosen.bf16 or chosen.fp16 or chosen.cudnn_benchmark or chosen.channels_last)


def test_apple_silicon_dataparallel_passes_through_and_ddp_uses_gloo_on_the_cpu(mac):
    # torch's DataParallel keeps no device ids with MPS (data_parallel.py: "device_type ==
    # 'mps'"): the module runs as it is, so `train` must have moved it to MPS itself.
    net = nn.Linear(3, 2)
    wrapped = nn.DataParallel(net, device_ids=[torch.device("mps")])
    assert wrapped.device_ids == [] and wrapped.module is net
    x = torch.ones(4, 3)
    assert torch.equal(wrapped(x), net(x))
    # DDP beside MPS: gloo processes on the CPU ("virtual devices"); MPS stays unused
    assert ddp.choose_backend("auto") == "gloo"
    with pytest.raises(devices.DeviceError, match="nccl processes need 2 GPUs"):
        launcher.launch(tiny(), 2, backend="nccl")


def test_apple_silicon_readers_see_mps_and_fp32_in_the_setup_banner(monkeypatch):
    """What a Mac reader's setup cell prints: the MPS device, fp32, and a CPU-class estimate."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setenv("MGPU_PROFILE", "smoke")
    profile, lines = setup_page("03_dataparallel")
    assert "hardware: Apple MPS; fp32" in lines and profile.name == "smoke"
