"""GPU truth: measure on the GPU at hand what the book predicts, in stages, under a time budget.

    MGPU_FASHION_MNIST_DIR=data/fashion-mnist python tools/gpu_check.py \
        --budget-s 270 --out $OUT/gpu.jsonl
    make gpu-check GPU_CHECK_ARGS="--budget-s 900"     # your own GPU (Colab included)
    python tools/gpu_check.py --dry-run --spec "H200 SXM" --profile full    # the plan only

Stages, in order of value: facts, the overheads the step-time model fits to published runs
(DataParallel's replicate per step, P2P between each pair of GPUs, their link, the chapter's
loader alone), the CUDA unit tests (tests/test_cuda.py), one run at the profile's settings (the
chapter's under `full`), the accuracy-drop runs of `mgpu_lib.lab.drop` at that scale, bench,
calibration, exercise 2 (CPU+GPU split) and exercise 1 (sweeps,
while time is left). Each stage first predicts its own time (the library's run-time predictor,
`mgpu_lib.perf.runtime`, the one the pages use, then what earlier stages measured) and skips itself
when that would not fit in what is left of `--budget-s`, counted from the process's start. Each
stage prints one line and appends one record to a JSON Lines file named after the device
(default `runs/gpu_<device>.jsonl` in the working folder, never the package's shipped records);
a failed stage records its error in one line and the next stage runs. Without CUDA every CUDA
stage is recorded as skipped; under `--profile smoke` a tiny CPU calibration still runs. Exit
status: 0 if no stage failed, 1 if one did, 2 for bad arguments (one line).
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

import psutil
import torch
from torch import nn

from mgpu_lib.book import store as results
from mgpu_lib.lab.bench import add_tflops, batch_curve, bench, measure, peak_tflops
from mgpu_lib.lab.anatomy import replicate_seconds
from mgpu_lib.devices import cpu_name, describe_devices, timed
from mgpu_lib.lab.diagnose import chapter_loader_images_per_s, topology
from mgpu_lib.perf.evidence import (Calibration, calibrate, cpu_spec, half_speed_batch, leave_one_out,
                               published_fit)
from mgpu_lib.hetero import HeteroDataParallel
from mgpu_lib.lab.drop import CONDITIONS, EXTRA, run_seed
from mgpu_lib.lab.hetero_bench import default_setup, measure_sync, measure_throughput, split_curve
from mgpu_lib.model import resnet18
from mgpu_lib.book.profiles import PROFILES, Profile, active_profile, get_profile
from mgpu_lib.lab.files import record_header
from mgpu_lib.book.store import ResultsError, append, check_writable
from mgpu_lib.book.pages import recorded_cpu_rates
from mgpu_lib.perf.runtime import StepModel, recorded_cpu, workload
from mgpu_lib.perf.scaling import (DEVICES, RESNET18, DeviceSpec, dp_python_s, loader_rate,
                              spec_for_name)
from mgpu_lib.perf.split_time import best_split, shard_grid
from mgpu_lib.config import resolve_switches
from mgpu_lib.book.sweep import as_point, key_of, load_store, plural, point_key, sweep
from mgpu_lib.book.cli import Parser
from mgpu_lib.config import POSITIVE_NUMBER
from mgpu_lib.training import TrainConfig, make_model, train

REPO = Path(__file__).resolve().parent.parent
STAGE_NAMES = ("facts", "overheads", "cuda_tests", "full_run", "bench", "calibration",
               "exercise2", "exercise1")
NO_CUDA, BUDGET = "no CUDA device", "budget"
# Guesses where nothing has been measured yet; each stage replaces them as it measures.
FACTS_S = {True: 5.0, False: 1.0}  # CUDA's first initialization takes seconds
OVERHEADS_S = 15.0                 # replicate x 6, P2P per pair, the loader over 30 batches
TESTS_S = 45.0                     # pytest + a torchrun/NCCL start + five tiny CUDA tests
TESTS_LIMIT_S = 180.0              # the CUDA tests are stopped after this
SETUP_S = 6.0                      # a run: load the images, build the model, cuDNN autotuning
MEASURE_SETUP_S = 1.5              # one bench.measure mode: model, synthetic data, warm-up
COMPILE_LIMIT_S = 60.0             # torch.compile is measured only if it compiles within this
CHILD_START_S = 15.0               # a fresh Python process importing torch and CUDA
SYNC_GUESS_S = 0.02                # hetero sync: ~45 MB of gradients and weights over PCIe
# (steps, repeats, warmup_steps) per calibration batch: on a GPU warm-up also autotunes cuDNN
CAL_STEPS = {True: (5, 2, 3), False: (2, 1, 1)}


class StageFailed(RuntimeError):
    """A stage that ran to the end and found a failure (e.g. failing tests): keeps its figures."""

    def __init__(self, message: str, figures: dict) -> None:
        super().__init__(message)
        self.figures = figures


@dataclass
class Check:
    """One run of the script: its settings, the device, the speed model and what was measured."""
    args: argparse.Namespace
    profile: Profile
    device: torch.device
    cuda: bool                 # CUDA here (or, for a --dry-run with --spec, assumed)
    spec: DeviceSpec
    spec_known: bool
    speed: StepModel
    hardware: str
    slug: str
    out: Optional[Path] = None
    run_id: str = ""
    done: dict = field(default_factory=dict)      # stage name -> figures of an "ok" stage
    # when the budget's clock started: the process's start for the script (importing torch is
    # inside the budget), the call's start for main() called from Python (tests)
    start: float = field(default_factory=time.time)

    def elapsed(self) -> float:
        return time.time() - self.start

    def left(self) -> float:
        return self.args.budget_s - self.elapsed()

    @property
    def n_train(self) -> int:
        return self.profile.train_limit or 60_000

    @property
    def n_test(self) -> int:
        return self.profile.test_limit or 10_000


@dataclass(frozen=True)
class Stage:
    name: str
    predict: Callable[[Check, float], float]       # (check, seconds left) -> seconds
    run: Callable[[Check], tuple]                  # check -> (figures, one-line summary)
    where: str = "cuda"                            # "any", "cuda", or "cuda or smoke"


# ---- small helpers --------------------------------------------------------------------------

def slug(name: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


def spec_for(device: torch.device, override: Optional[str], width: int
             ) -> tuple[DeviceSpec, bool, Optional[Calibration]]:
    """The datasheet for `device` (as `bench.peak_tflops` matches names), whether it is known,
    and for a CPU the line it is predicted by (`runtime.recorded_cpu`); an unknown GPU is
    predicted as a T4."""
    if override:
        return DEVICES[override], True, None
    if device.type == "cuda":
        spec = spec_for_name(torch.cuda.get_device_name(device))
        return (spec, True, None) if spec is not None else (DEVICES["T4"], False, None)
    cal = recorded_cpu(recorded_cpu_rates(), width, torch.get_num_threads())
    spec = replace(cpu_spec(cal, "CPU, at the slowest recorded rate", workload(width)),
                   source="mgpu_lib/recorded/bench_cpu.jsonl, scaled to this CPU's threads")
    return spec, False, cal


def one_line(e: BaseException) -> str:
    """An exception as one line, with where it was raised."""
    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    at = f" (at {Path(where.filename).name}:{where.lineno})" if where else ""
    return (f"{type(e).__name__}: {' '.join(str(e).split())}"[:400] + at)


def precision(sw) -> str:
    """The autocast a set of switches runs: bf16, fp16 (where the library has it) or fp32."""
    return "bf16" if sw.bf16 else "fp16" if getattr(sw, "fp16", False) else "fp32"


def has_torchvision() -> bool:
    """The chapter's loader (PIL + ToTensor) needs torchvision; the fast loop does not."""
    return importlib.util.find_spec("torchvision") is not None


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_child(cmd: list, timeout_s: float, env: Optional[dict] = None
              ) -> Optional[subprocess.CompletedProcess]:
    """Run `cmd` in its own session; on timeout stop its whole process group (inductor's
    compile workers included; a torchrun job dies with its parent). None on timeout."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def child_env() -> dict:
    """This environment, with the repository importable from any working folder."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{path}" if path else str(REPO)}


# ---- stage 1: facts -------------------------------------------------------------------------

def nvidia_smi() -> Optional[list]:
    """The first lines of `nvidia-smi`, or None where it is absent."""
    try:
        out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.splitlines()[:12]


def run_facts(check: Check) -> tuple:
    d = check.device
    sw = resolve_switches(TrainConfig(width=check.profile.width), d)
    f = dict(device_name=torch.cuda.get_device_name(d) if d.type == "cuda" else cpu_name(),
             precision_auto=precision(sw), switches_auto=sw.to_dict(),
             torch=torch.__version__, cuda=torch.version.cuda,
             cudnn=torch.backends.cudnn.version() if d.type == "cuda" else None,
             spec=check.spec.name, spec_known=check.spec_known, cpu=cpu_name(),
             cpu_count=os.cpu_count(), torch_threads=torch.get_num_threads(),
             torchvision=has_torchvision(), nvidia_smi=nvidia_smi())
    if d.type == "cuda":
        props = torch.cuda.get_device_properties(d)
        f.update(capability=list(torch.cuda.get_device_capability(d)),
                 memory_gib=props.total_memory / 2**30, sms=props.multi_processor_count,
                 gpus=torch.cuda.device_count())
    cap = ".".join(map(str, f.get("capability", []))) or "-"
    return f, (f"{f['device_name']}, compute capability {cap}, auto precision "
               f"{f['precision_auto']}, torch {f['torch']}, CUDA {f['cuda']}, spec "
               f"{f['spec']}{'' if check.spec_known else ' (assumed)'}")


# ---- stage 2: the overheads the model fits to published runs, measured here ---------------

def run_overheads(check: Check) -> tuple:
    n = torch.cuda.device_count()
    devices = [torch.device(f"cuda:{i}") for i in range(n)]
    peer = {f"{i}-{j}": torch.cuda.can_device_access_peer(i, j)
            for i in range(n) for j in range(n) if i < j}
    rep = replicate_seconds(resnet18(width=check.profile.width).to(devices[0]), devices)
    fit = published_fit()
    model = [dp_python_s(RESNET18, max(n, 2), fit.overheads(check.spec, 1, t)) / max(n, 2)
             for t in (0, 2)]
    loader = (chapter_loader_images_per_s(check.profile.batch_size) if has_torchvision()
              else None)
    f = dict(gpus=n, peer=peer, links={f"{i}-{j}": c for (i, j), c in topology().items()},
             replicate_s=rep, replicate_per_device_s=rep / n,
             model_python_per_device_s=model, loader_images_per_s=loader,
             model_loader_images_per_s=loader_rate(28, min(4, os.cpu_count() or 1)))
    no_p2p = [k for k, v in peer.items() if not v]
    return f, (f"{n} GPU(s), P2P off for {', '.join(no_p2p) or 'no pair'}; replicate "
               f"{rep / n * 1e3:.2f} ms per device (model: {model[0] * 1e3:.1f} to "
               f"{model[1] * 1e3:.1f} ms of DataParallel Python); loader "
               + (f"{loader:,.0f} images/s (model {f['model_loader_images_per_s']:,.0f})"
                  if loader else "not timed (torchvision missing)"))


# ---- stage 3: the CUDA unit tests -----------------------------------------------------------

def junit_counts(path: Path) -> dict:
    """Counts and the failing tests (name, first line of the message) from a JUnit XML file."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    counts = {k: sum(int(s.get(k, 0)) for s in suites)
              for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    bad = []
    for case in root.iter("testcase"):
        for tag in ("failure", "error"):
            for el in case.findall(tag):
                msg = (el.get("message") or el.text or "").strip().splitlines()
                bad.append(dict(test=case.get("name"), kind=tag, message=(msg or [""])[0][:300]))
    counts["failing"] = bad
    return counts


def run_cuda_tests(check: Check) -> tuple:
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "tests/test_cuda.py", "-q",
               "-o", "addopts=", "-p", "no:cacheprovider", f"--junitxml={xml}"]
        limit = min(TESTS_LIMIT_S, check.left())
        proc = run_child(cmd, limit, child_env())
        if proc is None:
            raise RuntimeError(f"the CUDA tests did not finish within {limit:.0f} s")
        f = junit_counts(xml) if xml.exists() else {}
    f.update(returncode=proc.returncode, tail=proc.stdout.strip().splitlines()[-3:])
    summary = (f"{f.get('passed', 0)} passed, {f.get('failures', 0) + f.get('errors', 0)} "
               f"failed, {f.get('skipped', 0)} skipped of {f.get('tests', 0)}")
    if proc.returncode == 0 and not f.get("passed"):
        raise StageFailed(f"{summary}: no CUDA test ran although CUDA is here", f)
    if proc.returncode != 0:
        names = "; ".join(f"{b['test']}: {b['message']}" for b in f.get("failing", []))
        raise StageFailed(f"{summary}: {names or (f['tail'] or ['no output'])[-1]}", f)
    return f, summary


# ---- stage 4: one run at the profile's settings ---------------------------------------------

def predict_fast_run(check: Check) -> float:
    p, s = check.profile, check.speed
    return SETUP_S + p.num_epochs * (s.epoch_s(p.batch_size, check.n_train) +
                                     s.eval_s(check.n_test))


def predict_chapter_run(check: Check, epochs: int = 2) -> float:
    """The chapter's loop: the GPU or the loader's workers, whichever is slower."""
    loader = loader_rate(28, min(4, os.cpu_count() or 1))   # the library's, measured per worker
    epoch = max(check.speed.epoch_s(check.profile.batch_size, check.n_train),
                check.n_train / loader)
    return SETUP_S + epochs * (epoch + check.n_test / loader)


def timed_run(config: TrainConfig, device: torch.device) -> tuple:
    """`train(config)` on one GPU: (the result, its wall time, per-epoch figures, peak memory)."""
    torch.cuda.reset_peak_memory_stats(device)
    with timed([device]) as t:
        r = train(config, progress=False)
    return r, dict(status=r.status, seconds=t.seconds, sec_per_epoch=r.sec_per_epoch,
                epoch_seconds=r.epoch_seconds, test_acc=r.test_acc, train_loss=r.train_loss,
                images_per_second=r.images_per_second, steps_per_epoch=r.steps_per_epoch,
                data_source=r.data_source, hardware=r.hardware,
                switches=r.extra.get("switches"), config=r.config,
                peak_memory_mib=torch.cuda.max_memory_allocated(device) / 2**20)


def ex1_store(check: Check) -> Path:
    """Exercise 1's sweep store: beside the records, named after the device."""
    return check.out.parent / f"ex1_{check.slug}.jsonl"


def store_sweep_point(check: Check, result, config: TrainConfig, seconds: float) -> None:
    """The full run is exercise 1's base point for seed 0 (`sweep` trains it exactly so):
    stored once, the sweep does not train it again."""
    rec = as_point(result, config, {})
    rec.extra["wall_seconds"] = round(seconds, 2)
    results.append(ex1_store(check), rec.to_dict())


def run_chapter_part(check: Check, config: TrainConfig) -> dict:
    """The chapter's loop for 2 epochs, if torchvision is here and it fits in the budget."""
    predicted = predict_chapter_run(check)
    if not has_torchvision():
        return dict(status="skipped", reason="torchvision missing (the chapter's loader)")
    if predicted > check.left():
        return dict(status="skipped", reason=BUDGET, predicted_s=predicted)
    _, run = timed_run(config.replace(fast=False, num_epochs=2), check.device)
    return dict(run, predicted_s=predicted)


def run_full(check: Check) -> tuple:
    config = check.profile.config(devices=1)
    result, fast = timed_run(config, check.device)
    store_sweep_point(check, result, config, fast["seconds"])
    if fast["epoch_seconds"]:    # later predictions follow what this GPU really did
        check.speed.rescale(fast["sec_per_epoch"] / fast["steps_per_epoch"], config.batch_size)
    chapter = run_chapter_part(check, config)
    f = dict(fast=fast, chapter=chapter, speed_scale=check.speed.scale)
    line = (f"fast {fast['sec_per_epoch']:.2f} s/epoch, test acc "
            f"{(fast['test_acc'] or [float('nan')])[-1]:.3f} after {len(fast['test_acc'])} "
            f"epochs ({fast['data_source']}), peak {fast['peak_memory_mib']:.0f} MiB")
    if chapter.get("epoch_seconds"):
        f["chapter_over_fast"] = chapter["sec_per_epoch"] / fast["sec_per_epoch"]
        line += (f"; chapter's loop {chapter['sec_per_epoch']:.2f} s/epoch "
                 f"({f['chapter_over_fast']:.1f}x)")
    else:
        line += f"; chapter's loop {chapter['status']} ({chapter.get('reason', '')})"
    if fast["status"] != "ok":
        raise StageFailed(f"the fast run {fast['status']}: {line}", f)
    return f, line


# ---- stage 5: why d2l's 2-GPU run loses accuracy, at the chapter's scale ----------------------

DROP_SEEDS = (0, 1, 2)
DROP_RUNS = len(CONDITIONS + EXTRA)       # the chapter's loop, each a full run at B or 2B


def predict_drop_seed(check: Check) -> float:
    """One seed's runs of `lab.drop`: the chapter's loop (its loader is the fast loop's here:
    device-resident batches copied each step), at the profile's epochs and images."""
    return DROP_RUNS * (predict_fast_run(check) - SETUP_S) + DROP_RUNS * SETUP_S


def run_drop(check: Check) -> tuple:
    """`mgpu_lib.lab.drop` at the profile's scale (the chapter's under `full`), as many seeds
    as fit; runs at 2B use every GPU (up to 2), as the chapter's second call does. The page
    "Why d2l's two-GPU run loses accuracy" reads the CPU record; this is the full-scale one."""
    p = check.profile
    out = check.out.parent / f"drop_{check.slug}.jsonl"
    gpus = [torch.device(f"cuda:{i}") for i in range(min(2, torch.cuda.device_count()))]
    done = []
    for seed in DROP_SEEDS:
        if done and predict_drop_seed(check) > check.left():
            break
        for rec in run_seed(seed, width=p.width, batch_size=p.batch_size, lr=p.lr,
                            num_epochs=p.num_epochs, train_limit=p.train_limit,
                            test_limit=p.test_limit, conditions=CONDITIONS + EXTRA,
                            devices=gpus or None):
            results.append(out, rec)
            done.append(rec)
    last = {c: [r["test_acc"][-1] for r in done if r["condition"] == c]
            for c in CONDITIONS + EXTRA}
    f = dict(store=str(out), seeds=len(done) // DROP_RUNS, last_epoch=last)
    return f, f"{f['seeds']} seed(s); last-epoch test acc " + ", ".join(
        f"{c} {sum(v) / len(v):.3f}" for c, v in last.items() if v)


# ---- stage 6: bench ---------------------------------------------------------------------------

def predict_bench_calls(check: Check) -> float:
    """bench twice (fp32, bf16): two loops each, 2 warm-up + 5 x 3 timed steps."""
    return 2 * 2 * (MEASURE_SETUP_S + 17 * check.speed.step_s(check.profile.batch_size))


def predict_compile(check: Check) -> float:
    return CHILD_START_S + COMPILE_LIMIT_S + 17 * check.speed.step_s(check.profile.batch_size)


def predict_bench(check: Check, left: float) -> float:
    """The bench calls, plus the compile probe where it fits before calibration and ex. 2."""
    base = predict_bench_calls(check)
    rest = reserve(check)
    return base + (predict_compile(check) if left - base - rest >= predict_compile(check)
                   else 0.0)


def reserve(check: Check) -> float:
    """Seconds kept for calibration and exercise 2: worth more than the compile probe."""
    return sum(s.predict(check, 0.0) for s in STAGES
               if s.name in ("calibration", "exercise2") and skip_reason(check, s) is None)


def bench_one(check: Check, bf16: bool) -> dict:
    """`bench` (chapter's loop vs fast loop); the fast loop alone where torchvision is missing."""
    p, d = check.profile, check.device
    if has_torchvision():
        return bench(width=p.width, batch_size=p.batch_size, device=d, bf16=bf16)
    sw = resolve_switches(TrainConfig(width=p.width, batch_size=p.batch_size, bf16=bf16), d)
    modes = measure({"fast": sw}, width=p.width, batch_size=p.batch_size, device=d)
    add_tflops(modes, p.width, d)
    return dict(kind="bench, fast loop only (torchvision missing: no chapter's loader)",
                width=p.width, batch_size=p.batch_size, modes=modes)


def probe_compile(out: str, profile: Profile) -> int:
    """In a child process: the fast loop compiled; its warm-up time includes compiling."""
    d = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")   # cpu: to test it
    sw = resolve_switches(TrainConfig(width=profile.width, batch_size=profile.batch_size,
                                      compile=True), d)
    with timed([d]) as t:
        modes = measure({"compiled": sw}, width=profile.width, batch_size=profile.batch_size,
                        steps=5, repeats=3, warmup_steps=2, device=d)
    add_tflops(modes, profile.width, d)
    m = modes["compiled"]
    timed_s = sum(5 * profile.batch_size / r for r in m["images_per_second"])
    m.update(wall_s=t.seconds, warmup_s=t.seconds - timed_s)
    Path(out).write_text(json.dumps(m), encoding="utf-8")
    return 0


def run_compile_part(check: Check) -> dict:
    """The compile probe in a child process, stopped if it does not compile within a minute."""
    need = predict_compile(check)
    if check.left() - reserve(check) < need:
        return dict(status="skipped", reason=BUDGET, predicted_s=need)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        out = Path(tmp) / "compile.json"
        cmd = [sys.executable, "-c", "import runpy, sys; g = runpy.run_path(sys.argv[1]); "
               "sys.exit(g['probe_compile'](sys.argv[2], g['get_profile'](sys.argv[3])))",
               str(Path(__file__).resolve()), str(out), check.profile.name]
        proc = run_child(cmd, need, child_env())
        if proc is None:
            return dict(status="skipped", reason=f"did not compile and run within {need:.0f} s "
                        f"({COMPILE_LIMIT_S:.0f} s for compiling)")
        if proc.returncode != 0 or not out.exists():
            tail = proc.stdout.strip().splitlines() or ["no output"]
            return dict(status="failed", error=tail[-1][:400])
        return dict(json.loads(out.read_text(encoding="utf-8")), status="ok")


def run_bench(check: Check) -> tuple:
    f = {name: bench_one(check, bf16) for name, bf16 in (("fp32", False), ("bf16", True))}
    f["compile"] = c = run_compile_part(check)
    parts = []
    for name in ("fp32", "bf16"):
        m = f[name]["modes"]["fast"]
        pct = f"{m['percent_of_peak']:.1f}%" if m["percent_of_peak"] else "?%"
        ratio = f", {f[name]['ratio']:.2f}x the chapter's" if "ratio" in f[name] else ""
        parts.append(f"{name} {m['median']:.0f} img/s = {m['tflops']:.1f} TFLOP/s ({pct} of "
                     f"peak){ratio}")
    if c["status"] == "ok":
        same = f["bf16" if c["switches"]["bf16"] else "fp32"]["modes"]["fast"]["median"]
        c["speedup"] = c["median"] / same
        parts.append(f"compiled {c['median']:.0f} img/s ({c['speedup']:.2f}x, warm-up with "
                     f"compile {c['warmup_s']:.0f} s)")
    else:
        parts.append(f"compile {c['status']} ({c.get('reason') or c.get('error')})")
    return f, "; ".join(parts)


# ---- stage 7: calibration -------------------------------------------------------------------

def calibration_batches(check: Check) -> list:
    """8 to 1024 on a GPU; 8 to 32 for the tiny CPU version under smoke (seconds)."""
    top = 1024 if check.cuda else 32
    return [2 ** k for k in range(3, 11) if 2 ** k <= top]


def predict_calibration(check: Check, left: float) -> float:
    steps, repeats, warmup = CAL_STEPS[check.cuda]
    return sum(MEASURE_SETUP_S + (warmup + steps * repeats) * check.speed.step_s(b)
               for b in calibration_batches(check))


def run_calibration(check: Check) -> tuple:
    d, w = check.device, check.profile.width
    steps, repeats, warmup = CAL_STEPS[check.cuda]
    rows = batch_curve(calibration_batches(check), width=w, steps=steps, repeats=repeats,
                       warmup_steps=warmup, device=d)
    cal = calibrate([(r["batch"], r["step_s"]) for r in rows])
    sw = resolve_switches(TrainConfig(width=w), d)
    achieved = cal.images_per_second * workload(w).train_flops / 1e12
    peak = peak_tflops(d, sw.bf16)
    f = dict(rows=rows, width=w, precision=precision(sw),
             images_per_second=cal.images_per_second, step_s=cal.step_s,
             rms_error_s=cal.rms_error_s, achieved_tflops=achieved, peak_tflops=peak,
             mfu=achieved / peak if peak else None,
             mfu_vs_fp32_peak=achieved / check.spec.fp32_tflops if check.spec_known else None,
             half_speed_batch=half_speed_batch(rows),
             # the same quantity read off the fitted line at the same batches
             half_speed_batch_model=half_speed_batch([
                 dict(batch=b, images_per_second=b / cal.step_time(b))
                 for b in (r["batch"] for r in rows)]),
             leave_one_out_max_error=max(abs(r["error"]) for r in leave_one_out(
                 [(r["batch"], r["step_s"]) for r in rows])) if len(rows) > 2 else None)
    if check.cuda:
        check.speed.cal = cal             # stages 8 and 9 predict from the measured line
    b_half, b_line = (f"{b:.0f}" if b else f"< {rows[0]['batch']}"
                      for b in (f["half_speed_batch"], f["half_speed_batch_model"]))
    mfu = f"{f['mfu']:.0%} of {peak:g} TFLOP/s peak" if peak else "peak unknown"
    return f, (f"{cal.images_per_second:.0f} images/s + {cal.step_s * 1e3:.2f} ms/step, "
               f"{achieved:.2f} TFLOP/s ({mfu}), b1/2 {b_half} measured, "
               f"{b_line} from the line")


# ---- stage 8: exercise 2 --------------------------------------------------------------------

def cpu_rate_guess(check: Check) -> float:
    """Images/s the host CPU trains at, before measuring: the slowest recorded CPU's, scaled to
    this one's cores."""
    return recorded_cpu(recorded_cpu_rates(), check.profile.width, os.cpu_count() or 1).images_per_second


def predict_exercise2(check: Check, left: float) -> float:
    """Two throughputs, the sync, then ~10 CPU shares x 4 steps, the slowest share at most
    three times the ideal one (`shard_grid`)."""
    b = check.profile.batch_size
    cpu, gpu_step = cpu_rate_guess(check), check.speed.step_s(b)
    ideal = b * cpu / (b / gpu_step + cpu)
    slowest = max(gpu_step, min(b, max(8, 3 * ideal)) / cpu) + SYNC_GUESS_S
    return (3 * MEASURE_SETUP_S + 7 * gpu_step + 3 * max(1, b // 8) / cpu +
            6 * SYNC_GUESS_S + 10 * 4 * slowest)


def run_exercise2(check: Check) -> tuple:
    b = check.profile.batch_size
    setup = default_setup()
    net = make_model(TrainConfig(width=check.profile.width), setup.devices[0])
    speeds = [measure_throughput(net, setup.devices[0], b, steps=5, warmup=2),
              measure_throughput(net, "cpu", max(1, b // 8), steps=2, warmup=1)]
    with HeteroDataParallel(net, setup.devices, speeds) as hdp:
        sync = measure_sync(hdp, steps=5)
        plan = best_split(b, speeds, sync)
        g = torch.Generator().manual_seed(0)
        x, y = torch.rand(b, 1, 28, 28, generator=g), torch.randint(0, 10, (b,), generator=g)
        opt = torch.optim.SGD(hdp.module.parameters(), lr=0.01)
        rows = split_curve(hdp, x, y, opt, nn.CrossEntropyLoss(), speeds, sync,
                           shard_grid(b, plan.sizes[1]))
    best = min(rows, key=lambda r: r["measured_s"])
    alone = next(r["measured_s"] for r in rows if r["share"] == 0)
    f = dict(setup=setup.label, batch=b, speeds=speeds, sync_s=sync,
             predicted=dict(sizes=list(plan.sizes), step_s=plan.step_s, alone_s=plan.alone_s,
                            speedup=plan.speedup, worth_it=plan.worth_it),
             grid=rows, measured_best_cpu_share=best["share"],
             measured_best_s=best["measured_s"], gpu_alone_s=alone,
             measured_speedup=alone / best["measured_s"])
    return f, (f"GPU {speeds[0]:.0f} img/s, CPU {speeds[1]:.0f} img/s, sync "
               f"{sync * 1e3:.1f} ms; predicted best CPU share {plan.sizes[1]} of {b} "
               f"({plan.speedup:.2f}x), measured best {best['share']} "
               f"({f['measured_speedup']:.2f}x vs the GPU alone)")


# ---- stage 9: exercise 1 --------------------------------------------------------------------

def sweep_points(profile: Profile) -> list:
    """(batch, lr): the batch sweep at the profile's lr, then the lr sweep at its batch; under
    `full` batches 128..1024 and lrs 0.05..0.4."""
    b, lr = profile.batch_size, profile.lr
    points = [(b * k // 2, lr) for k in (1, 2, 4, 8)]
    return points + [(b, lr * k / 2) for k in (1, 4, 8)]


def predict_sweep_run(check: Check, batch: int) -> float:
    """One run of the profile's epochs at `batch`: the full run's wall time per epoch (setup and
    evaluation included), scaled by the speed model; the model alone without a full run."""
    p, s = check.profile, check.speed
    per_epoch = s.epoch_s(batch, check.n_train) + s.eval_s(check.n_test)
    fast = (check.done.get("full_run") or {}).get("fast")
    if fast and fast["epoch_seconds"]:
        base = s.epoch_s(p.batch_size, check.n_train) + s.eval_s(check.n_test)
        return p.num_epochs * fast["seconds"] / len(fast["epoch_seconds"]) * per_epoch / base
    return SETUP_S + p.num_epochs * per_epoch


def stored_keys(check: Check) -> set:
    """Keys of the points already in exercise 1's store (none in a --dry-run)."""
    if check.args.dry_run or not ex1_store(check).exists():
        return set()
    try:
        return {key_of(r) for r in load_store(ex1_store(check)) if r.status != "failed"}
    except ResultsError:      # a store that is not one: the sweep itself will say so
        return set()


def sweep_plan(check: Check, left: float) -> list:
    """[(batch, lr, seed, predicted s, fits)], seed by seed, greedily in `left` seconds; a
    point already stored costs nothing."""
    plan, stored = [], stored_keys(check)
    base = check.profile.config(devices=1)
    for seed in check.profile.seeds:
        for b, lr in sweep_points(check.profile):
            key = point_key(base.replace(batch_size=b, lr=lr, seed=seed))
            t = 0.0 if key in stored else predict_sweep_run(check, b)
            fits = t <= left
            left -= t if fits else 0.0
            plan.append((b, lr, seed, t, fits))
    return plan


def predict_exercise1(check: Check, left: float) -> float:
    plan = sweep_plan(check, left)
    fitting = sum(t for *_, t, fits in plan if fits)
    todo = [t for *_, t, _ in plan if t > 0]
    return fitting if fitting or not todo else min(todo)    # nothing fits: it skips


def run_exercise1(check: Check) -> tuple:
    store, runs = ex1_store(check), []
    base = check.profile.config(devices=1)
    for b, lr, seed, cost, _ in sweep_plan(check, check.left()):
        t = cost and predict_sweep_run(check, b)   # again: the clock and the model moved on
        run = dict(batch_size=b, lr=lr, seed=seed, predicted_s=t, stored_before=not cost)
        if t > check.left():
            runs.append(dict(run, status="not started", reason=BUDGET))
            continue
        start = time.monotonic()
        rec = sweep(base, {"batch_size": [b], "lr": [lr]}, seeds=[seed], store=store)[0]
        runs.append(dict(run, status=rec.status, seconds=time.monotonic() - start,
                         final_test_acc=rec.final_test_acc, sec_per_epoch=rec.sec_per_epoch))
    done = [r for r in runs if r["status"] != "not started"]
    stored = sum(r["stored_before"] for r in done)
    f = dict(store=str(store), runs=runs, done=len(done), stored_before=stored,
             planned=len(runs))
    seeds, points = len(check.profile.seeds), len(sweep_points(check.profile))
    return f, (f"{len(done)} of {plural(len(runs), 'run')} ({plural(seeds, 'seed')} x "
               f"{plural(points, 'point')}; {stored} stored before) in {store.name}")


# ---- the driver -----------------------------------------------------------------------------

STAGES = (
    Stage("facts", lambda c, left: FACTS_S[c.cuda], run_facts, "any"),
    Stage("overheads", lambda c, left: OVERHEADS_S, run_overheads),
    Stage("cuda_tests", lambda c, left: TESTS_S, run_cuda_tests),
    Stage("full_run", lambda c, left: predict_fast_run(c) + predict_chapter_run(c), run_full),
    Stage("accuracy_drop", lambda c, left: predict_drop_seed(c), run_drop),
    Stage("bench", predict_bench, run_bench),
    Stage("calibration", predict_calibration, run_calibration, "cuda or smoke"),
    Stage("exercise2", predict_exercise2, run_exercise2),
    Stage("exercise1", predict_exercise1, run_exercise1),
)


def skip_reason(check: Check, stage: Stage) -> Optional[str]:
    """Why `stage` does not run here at all (before any budget question), or None."""
    if check.args.only and stage.name not in check.args.only:
        return "not selected (--only)"
    if stage.where == "any" or check.cuda:
        return None
    if stage.where == "cuda or smoke" and check.profile.name == "smoke":
        return None
    return NO_CUDA


def plan(check: Check) -> list:
    """[(stage, predicted s or None, why it would not run or "")], as the run would decide."""
    left, rows = check.left(), []
    for stage in STAGES:
        why = skip_reason(check, stage)
        t = None if why else stage.predict(check, left)
        if t is not None and t > left:
            why = BUDGET
        rows.append((stage, t, why or ""))
        left -= t if not why else 0.0
    return rows


def record(check: Check, stage: Stage, status: str, seconds: float, predicted, note: str,
           figures: dict) -> dict:
    rec = record_header(hardware=check.hardware, profile=check.profile.name,
                 config=dict(budget_s=check.args.budget_s, device=str(check.device)))
    rec.update(stage=stage.name, index=STAGES.index(stage) + 1, status=status,
               seconds=round(seconds, 3), predicted_s=predicted, device=str(check.device),
               cuda=torch.version.cuda, budget_s=check.args.budget_s,
               elapsed_s=round(check.elapsed(), 3), run_id=check.run_id,
               time=datetime.now(timezone.utc).isoformat(timespec="seconds"), figures=figures)
    if status == "skipped":
        rec["reason"] = note
    elif status == "failed":
        rec["error"] = note
    return rec


def run_stage(check: Check, stage: Stage) -> str:
    """Predict, then run or skip `stage`; append its record and print its line."""
    t0, predicted, status, figures = time.monotonic(), None, "skipped", {}
    note = skip_reason(check, stage)
    if not note:
        try:
            predicted = stage.predict(check, check.left())
            if predicted > check.left():
                note = BUDGET
            else:
                figures, note = stage.run(check)
                status = "ok"
        except StageFailed as e:
            status, figures, note = "failed", e.figures, " ".join(str(e).split())
        except Exception as e:                 # the stage's error is data; the next stage runs
            status, note = "failed", one_line(e)
        finally:
            free_memory()
    if status == "ok":
        check.done[stage.name] = figures
    seconds = time.monotonic() - t0
    append(check.out, record(check, stage, status, seconds, predicted, note, figures))
    i = STAGES.index(stage) + 1
    pred = f" (predicted {predicted:.0f} s)" if predicted is not None else ""
    print(f"[{i}/{len(STAGES)}] {stage.name}: {status} in {seconds:.1f} s{pred}: {note}",
          flush=True)
    return status


def header(check: Check, rows: list) -> str:
    total = sum(t for _, t, why in rows if t is not None and not why)
    parts = ", ".join(f"{s.name} {t:.0f}" if t is not None and not why else f"{s.name} -"
                      for s, t, why in rows)
    known = "" if check.spec_known else " (assumed)"
    return (f"gpu_check: {check.hardware}; profile {check.profile.name}; step-time model for "
            f"{check.spec.name}{known}; predicted total {total:.0f} s of a "
            f"{check.args.budget_s:.0f} s budget ({parts})")


def print_plan(check: Check) -> None:
    """--dry-run: the plan, one line per stage, and the predicted total."""
    rows = plan(check)
    print(header(check, rows))
    for i, (stage, t, why) in enumerate(rows, 1):
        when = f"{t:.0f} s" if t is not None else "-"
        print(f"plan [{i}/{len(rows)}] {stage.name}: {when}" + (f", skipped ({why})" if why
                                                                 else ""))
    if not rows[-1][2]:
        runs = sweep_plan(check, check.left() - sum(t for _, t, w in rows[:-1] if t and not w))
        print(f"  exercise1: {sum(fits for *_, fits in runs)} of {len(runs)} runs fit")
    total = sum(t for _, t, why in rows if t is not None and not why)
    print(f"predicted total: {total:.0f} s of {check.args.budget_s:.0f} s budget")


def stages(text: str) -> set:
    """--only: comma-separated stage names."""
    chosen = set(text.split(","))
    unknown = ", ".join(sorted(chosen - set(STAGE_NAMES)))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown stage(s) {unknown}; stages: "
                                         f"{', '.join(STAGE_NAMES)}")
    return chosen


def parse_args(argv=None) -> argparse.Namespace:
    """The command line's front end (`mgpu_lib.book.cli.Parser`, checks from the settings'):
    a bad argument is one line, exit 2."""
    p = Parser(prog="gpu_check", description=__doc__.splitlines()[0])
    # a finite number above 0 (nan and inf would switch the budget off)
    p.add_argument("--budget-s", type=POSITIVE_NUMBER, default=270.0,
                   help="total seconds for the whole script, imports included (default 270)")
    p.add_argument("--out", help="JSON Lines file to append to (default "
                                 "runs/gpu_<device>.jsonl in this folder)")
    p.add_argument("--profile", choices=list(PROFILES), default=None,
                   help="sizes of the stages (default: MGPU_PROFILE, else full with CUDA)")
    p.add_argument("--spec", choices=list(DEVICES), help="predict with this datasheet; on a "
                   "machine without CUDA a --dry-run then plans as if the GPU were here")
    p.add_argument("--only", type=stages, default=set(),
                   help=f"comma-separated stages to run ({', '.join(STAGE_NAMES)})")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    return p.parse_args(argv)


def make_check(args: argparse.Namespace, started: Optional[float] = None) -> Check:
    """The device, its datasheet and speed model, and where the records go."""
    profile = get_profile(args.profile) if args.profile else active_profile()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda:0" if cuda else "cpu")
    spec, known, cal = spec_for(device, args.spec, profile.width)
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    check = Check(args, profile, device, cuda or bool(args.dry_run and args.spec), spec,
                  known, StepModel(spec, profile.width, cal=cal), describe_devices([device]),
                  slug(name), run_id=datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ"))
    check.start = started if started is not None else check.start
    # never into the package's shipped records: a run's records are the user's until copied
    check.out = Path(args.out) if args.out else Path("runs") / f"gpu_{check.slug}.jsonl"
    return check


def main(argv=None, started: Optional[float] = None) -> int:
    """Run the stages; `started` is when the budget's clock started (default: now)."""
    args = parse_args(argv)
    try:
        check = make_check(args, started)
    except ValueError as e:                       # MGPU_PROFILE that names no profile
        print(f"gpu_check: error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        print_plan(check)
    try:     # both stores, before any stage runs (a --dry-run says it too): a file that is no
        check_writable(check.out, store=True, kind="gpu_check stage")    # store, another kind's
        check_writable(ex1_store(check), store=True, kind="run")
        if not args.dry_run:
            check.out.parent.mkdir(parents=True, exist_ok=True)
    except (ResultsError, OSError) as e:
        print(f"gpu_check: error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        return 0
    print(header(check, plan(check)), flush=True)
    print(f"gpu_check: records to {check.out}", flush=True)
    try:
        statuses = [run_stage(check, stage) for stage in STAGES]
    except ResultsError as e:           # a record that could not be stored (a full disk)
        print(f"gpu_check: error: {e}", file=sys.stderr)
        return 2
    print(f"gpu_check: done in {check.elapsed():.0f} s: "
          + ", ".join(f"{statuses.count(s)} {s}" for s in ("ok", "failed", "skipped")),
          flush=True)
    return 1 if "failed" in statuses else 0


if __name__ == "__main__":
    sys.exit(main(started=psutil.Process().create_time()))
