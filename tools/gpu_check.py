"""One prepared GPU run whose records land on the pages, within 8 minutes on one H100 or H200.

    MGPU_FASHION_MNIST_DIR=data/fashion-mnist python tools/gpu_check.py --out runs/gpu.jsonl
    python tools/gpu_check.py --dry-run --spec "H200 SXM"     # the plan, on any machine

Stages (STAGES, in order) each have a fixed estimate and are skipped, with the reason, when it
does not fit in what is left of --budget-s (counted from the process's start); a failed stage
records its error in one line and the next runs. Each appends a record with the one header to
--out (default runs/gpu_<device>.jsonl); beside it go bench's row of precision.json (what
`devices.measured_precision` reads), the runs (run_<device>.jsonl) and the drop records
(drop_<device>.jsonl): shipping them is copying them into mgpu_lib/recorded/. Exit status 0, 1
if a stage failed, 2 for a bad argument or output (one line).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import psutil
import torch
from torch import nn

from mgpu_lib.book.cli import Parser
from mgpu_lib.book.flags import POSITIVE_NUMBER
from mgpu_lib.book.profiles import PROFILES, Profile, get_profile
from mgpu_lib.book.store import ResultsError, append, check_writable
from mgpu_lib.config import REFERENCE, TrainConfig, resolve_switches
from mgpu_lib.devices import describe_devices
from mgpu_lib.hetero import HeteroDataParallel
from mgpu_lib.lab.bench import add_tflops, measure
from mgpu_lib.lab.d2l import chapter_data
from mgpu_lib.lab.diagnose import topology
from mgpu_lib.lab.drop import CONDITIONS, EXTRA, run_seed
from mgpu_lib.ddp import write_atomic
from mgpu_lib.lab.files import record_header
from mgpu_lib.lab.hetero_bench import default_setup, measure_sync, measure_throughput, split_curve
from mgpu_lib.perf.scaling import DEVICES
from mgpu_lib.perf.split_time import best_split, shard_grid
from mgpu_lib.training import make_model, train

REPO = Path(__file__).resolve().parent.parent
# Seconds each stage takes on one H100 or H200 under `full`, from the one H200 run (issue 51: the
# old nine stages in 387 s), rounded up. compile's is also its child's time limit; full_run's is
# both loops at 10 epochs (fewer run where less is left); drop's is one seed's five runs of the
# chapter's loop, repeated while seeds fit beside exercise 2's.
ESTIMATE_S = {"facts": 5, "cuda_tests": 45, "bench": 30, "compile": 90, "full_run": 95,
              "drop": 150, "exercise2": 20}
STAGES = tuple(ESTIMATE_S)
NO_CUDA = "no CUDA device"
# bench's precisions: the settings each asks `resolve_switches` for
PRECISIONS = {"tf32": dict(bf16=False, fp16=False), "bf16": dict(bf16=True, fp16=False),
              "fp16": dict(bf16=False, fp16=True)}


class Stop(Exception):
    """A stage that ends early as `status` ("failed" or "skipped"), keeping what it measured."""

    def __init__(self, status: str, message: str, figures: Optional[dict] = None):
        super().__init__(" ".join(message.split()))
        self.status, self.figures = status, figures or {}


@dataclasses.dataclass
class Run:
    args: argparse.Namespace
    profile: Profile
    device: torch.device
    cuda: bool                 # CUDA here (or, for --dry-run --spec, assumed)
    hardware: str
    out: Path
    slug: str
    start: float = dataclasses.field(default_factory=time.time)

    def left(self) -> float:
        return self.args.budget_s - (time.time() - self.start)

    def beside(self, name: str) -> Path:
        return self.out.parent / f"{name}_{self.slug}.jsonl"


def child(cmd: list, limit_s: float) -> tuple[str, Optional[int]]:
    """(output, exit code) of `cmd` run from the repository; killed, code None, at `limit_s`."""
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        return proc.communicate(timeout=max(1.0, limit_s))[0], proc.returncode
    except subprocess.TimeoutExpired:
        for p in psutil.Process(proc.pid).children(recursive=True) + [psutil.Process(proc.pid)]:
            with contextlib.suppress(psutil.Error):      # gone already
                p.kill()
        return proc.communicate()[0], None


def facts(run: Run) -> tuple:
    d, n = run.device, torch.cuda.device_count() if run.device.type == "cuda" else 0
    f = dict(torch=str(torch.__version__), cuda=torch.version.cuda, gpus=n,
             cpu_count=os.cpu_count(), auto=resolve_switches(run.profile.train, d).describe())
    if n:
        f.update(gpu=torch.cuda.get_device_name(d), cudnn=torch.backends.cudnn.version(),
                 capability=list(torch.cuda.get_device_capability(d)),
                 memory_gib=round(torch.cuda.get_device_properties(d).total_memory / 2**30, 1),
                 topology={f"{i}-{j}": c for (i, j), c in topology().items()} if n > 1 else {})
    cap = ".".join(map(str, f.get("capability", []))) or "-"
    return f, (f"{n} x {f.get('gpu', 'no GPU')} (capability {cap}), torch {f['torch']}, CUDA "
               f"{f['cuda']}; auto: {f['auto']}")


def cuda_tests(run: Run) -> tuple:
    out, code = child([sys.executable, "-m", "pytest", "-m", "cuda", "tests/test_cuda.py", "-q",
                       "-o", "addopts=", "-p", "no:cacheprovider"],
                      min(2 * ESTIMATE_S["cuda_tests"], run.left()))
    lines = out.strip().splitlines() or ["no output"]
    f = {w: int(n) for n, w in re.findall(r"(\d+) (passed|failed|skipped|errors?)", lines[-1])}
    f.update(exit_code=code, failing=[x[:200] for x in lines if x.startswith(("FAILED", "ERROR"))])
    summary = ", ".join(f"{f.get(k, 0)} {k}" for k in ("passed", "failed", "skipped"))
    if code != 0 or not f.get("passed"):      # a run that passes nothing is no pass either
        raise Stop("failed", ("did not finish in time; " if code is None else "") +
                   f"{summary}: {'; '.join(f['failing']) or lines[-1]}", f)
    return f, summary


def bench(run: Run) -> tuple:
    """One `measure`, round-robin: the chapter's loop (its loader needs torchvision) and the
    fast loop in each precision; its row of precision.json."""
    p, d = run.profile, run.device
    modes = {"chapter": REFERENCE} if importlib.util.find_spec("torchvision") else {}
    for name, settings in PRECISIONS.items():
        sw = resolve_switches(TrainConfig(width=p.width, batch_size=p.batch_size, **settings), d)
        modes["fp32" if name == "tf32" and not getattr(sw, "tf32", False) else name] = sw
    m = measure(modes, width=p.width, batch_size=p.batch_size, device=d)
    add_tflops(m, p.width, d)
    rate = {name: m[name]["median"] for name in m}
    gpu = torch.cuda.get_device_name(d) if d.type == "cuda" else "cpu"
    row = dict(gpu=gpu, width=p.width, batch=p.batch_size,
               images_per_s={k: round(v, 1) for k, v in rate.items() if k != "chapter"},
               source=f"tools/gpu_check.py on {gpu}, {datetime.now(timezone.utc):%Y-%m-%d}")
    path = run.out.parent / "precision.json"      # one row a GPU model and width
    rows = json.loads(path.read_text(encoding="utf-8")) if path.exists() else []
    write_atomic(path, json.dumps([r for r in rows if (r["gpu"], r["width"]) != (gpu, p.width)]
                                  + [row], indent=1) + "\n")
    over = {k: v / rate["chapter"] for k, v in rate.items()} if "chapter" in rate else {}
    return (dict(width=p.width, batch=p.batch_size, modes=m, precision_row=row, over_chapter=over),
            "; ".join(f"{k} {v:,.0f} img/s" + (f" ({over[k]:.2f}x)" if over else "")
                      for k, v in rate.items()))


# the compile child: for each setting named, the fast loop with it on against fp32 eager
CHILD = """import json, sys, time, torch
from mgpu_lib.config import TrainConfig, resolve_switches
from mgpu_lib.lab.bench import measure
w, b = int(sys.argv[1]), int(sys.argv[2])
d = torch.device("cuda" if torch.cuda.is_available() else "cpu")
sw = lambda **on: resolve_switches(TrainConfig(width=w, batch_size=b, bf16=False, fp16=False,
                                               **on), d)
for name in sys.argv[3:]:
    t = time.time()
    on = {"compile": dict(compile=True), "graphs": dict(compile="graphs")}.get(name, {name: True})
    m = measure({"eager": sw(), name: sw(**on)}, width=w, batch_size=b, device=d)
    print(json.dumps(dict(name=name, eager=m["eager"]["median"], rate=m[name]["median"],
                          wall_s=time.time() - t)), flush=True)
"""


def compiled(run: Run) -> tuple:
    """torch.compile, then its CUDA-graph mode (compile="graphs"), against fp32 eager, in a
    child stopped at the stage's estimate."""
    p, limit = run.profile, min(ESTIMATE_S["compile"], run.left())
    names = ["compile", "graphs"]
    out, code = child([sys.executable, "-c", CHILD, str(p.width), str(p.batch_size), *names],
                      limit)
    done = {r.pop("name"): r for r in (json.loads(x) for x in out.splitlines()
                                       if x.startswith("{"))}
    not_run = {n: f"did not finish within {limit:.0f} s" for n in names if n not in done}
    f = dict(width=p.width, batch=p.batch_size, limit_s=limit, modes=done, not_run=not_run)
    if code not in (0, None):
        raise Stop("failed", (out.strip().splitlines() or ["no output"])[-1][:300], f)
    if not done:
        raise Stop("skipped", not_run["compile"], f)
    return f, "; ".join([f"{n} {r['rate']:,.0f} img/s ({r['rate'] / r['eager']:.2f}x eager "
                         f"fp32, {r['wall_s']:.0f} s with compiling)" for n, r in done.items()]
                        + [f"{n}: {why}" for n, why in not_run.items()])


def units(run: Run, name: str, left: float) -> int:
    """How much of `name` fits in `left` s: epochs, seeds (exercise 2's time kept), or 1 or 0."""
    p, est = run.profile, ESTIMATE_S[name]
    if name == "full_run":
        return min(p.num_epochs, int(p.num_epochs * left / est))
    if name == "drop":
        return max(0, min(len(p.seeds), int((left - ESTIMATE_S["exercise2"]) / est)))
    return int(est <= left)


def full_run(run: Run) -> tuple:
    """The chapter's run (`train`, one GPU), the fast loop then the chapter's: both stored."""
    config = run.profile.config(devices=1, num_epochs=max(1, units(run, "full_run", run.left())))
    f = dict(epochs=config.num_epochs)
    for name, c in (("fast", config), ("chapter", config.replace(fast=False))):
        r = train(c, data=None if c.fast else chapter_data(c), progress=False)  # all stored
        append(run.beside("run"), r.to_dict())
        f[name] = dict(status=r.status, sec_per_epoch=r.sec_per_epoch, test_acc=r.test_acc,
                       data_source=r.data_source, switches=r.extra.get("switches"))
    f["chapter_over_fast"] = f["chapter"]["sec_per_epoch"] / f["fast"]["sec_per_epoch"]
    line = f"{config.num_epochs} epochs: " + ", ".join(
        f"{k} {f[k]['sec_per_epoch']:.2f} s/epoch, test acc {(f[k]['test_acc'] or [0])[-1]:.3f}"
        for k in ("fast", "chapter")) + f"; the chapter's epoch {f['chapter_over_fast']:.2f}x"
    if f["fast"]["status"] != "ok" or f["chapter"]["status"] != "ok":
        raise Stop("failed", line, f)
    return f, line


def drop(run: Run) -> tuple:
    """`lab.drop`'s five runs a seed at the profile's scale, on two GPUs at 2B where there are."""
    p, store, done = run.profile, run.beside("drop"), []
    devices = [torch.device(f"cuda:{i}") for i in range(min(2, torch.cuda.device_count()))]
    for i, seed in enumerate(p.seeds):
        if i and not units(run, "drop", run.left()):
            break
        done += run_seed(seed, width=p.width, batch_size=p.batch_size, lr=p.lr,
                         num_epochs=p.num_epochs, train_limit=p.train_limit,
                         test_limit=p.test_limit, source=p.data_source, devices=devices or None,
                         conditions=CONDITIONS + EXTRA, save=lambda rec: append(store, rec))
    last = {c: [r["test_acc"][-1] for r in done if r["condition"] == c] for c in CONDITIONS + EXTRA}
    f = dict(store=str(store), seeds=len(done) // len(last), last_test_acc=last)
    return f, f"{f['seeds']} seed(s); last-epoch test acc " + ", ".join(
        f"{c} {sum(v) / len(v):.3f}" for c, v in last.items() if v)


def exercise2(run: Run) -> tuple:
    """Each device's speed and the sync, the predicted best split, then each split measured."""
    b, setup = run.profile.batch_size, default_setup()
    net = make_model(TrainConfig(width=run.profile.width), setup.devices[0])
    speeds = [measure_throughput(net, setup.devices[0], b, steps=5, warmup=2),
              measure_throughput(net, setup.devices[1], max(1, b // 8), steps=2, warmup=1)]
    with HeteroDataParallel(net, setup.devices, speeds) as hdp:
        sync = measure_sync(hdp, steps=5)
        split = best_split(b, speeds, sync)
        g = torch.Generator().manual_seed(0)
        x, y = torch.rand(b, 1, 28, 28, generator=g), torch.randint(0, 10, (b,), generator=g)
        rows = split_curve(hdp, x, y, torch.optim.SGD(hdp.module.parameters(), lr=0.01),
                           nn.CrossEntropyLoss(), speeds, sync, shard_grid(b, split.sizes[1]))
    best = min(rows, key=lambda r: r["measured_s"])
    gain = next(r["measured_s"] for r in rows if r["share"] == 0) / best["measured_s"]
    f = dict(setup=setup.label, batch=b, speeds=speeds, sync_s=sync, grid=rows,
             predicted=dict(sizes=list(split.sizes), step_s=split.step_s, speedup=split.speedup),
             measured_best_share=best["share"], measured_speedup=gain)
    return f, (f"GPU {speeds[0]:,.0f} img/s, CPU {speeds[1]:,.0f} img/s, sync {sync * 1e3:.1f}"
               f" ms; best CPU share of {b}: predicted {split.sizes[1]}, measured {best['share']}"
               f" ({gain:.2f}x the GPU alone)")


RUNS = {"facts": facts, "cuda_tests": cuda_tests, "bench": bench, "compile": compiled,
        "full_run": full_run, "drop": drop, "exercise2": exercise2}


def plan(run: Run, name: str, left: float) -> tuple[float, str]:
    """(seconds `name` will take with `left` seconds left, what of it), or (0, why it won't)."""
    n, p = units(run, name, left), run.profile
    if name != "facts" and not run.cuda:
        return 0.0, NO_CUDA
    if not n:
        return 0.0, f"budget: estimated {ESTIMATE_S[name]} s, {max(0.0, left):.0f} s left"
    of = {"full_run": (p.num_epochs, "epochs"), "drop": (len(p.seeds), "seeds")}.get(name)
    return (ESTIMATE_S[name] * n / (p.num_epochs if name == "full_run" else 1),
            f"{n} of {of[0]} {of[1]}" if of else "")


def print_plan(run: Run) -> None:
    left, total = run.left(), 0.0
    print(f"gpu_check plan: profile {run.profile.name} on {run.hardware}; H100/H200 estimates")
    for i, name in enumerate(STAGES, 1):
        t, note = plan(run, name, left)
        left, total = left - t, total + t
        print(f"plan [{i}/{len(STAGES)}] {name}: " + (f"{t:.0f} s" + (f" ({note})" if note else "")
                                                       if t else f"skipped ({note})"))
    print(f"predicted total: {total:.0f} s of {run.args.budget_s:.0f} s budget")


def run_stage(run: Run, name: str, run_id: str) -> str:
    """Run `name` or skip it; append its record and print its line."""
    t0, figures = time.monotonic(), {}
    planned, note = plan(run, name, run.left())
    status = "ok" if planned else "skipped"
    if planned:
        try:
            figures, note = RUNS[name](run)
        except Stop as e:
            status, figures, note = e.status, e.figures, str(e)
        except Exception as e:        # the stage's error is data; the next stage runs
            status, note = "failed", f"{type(e).__name__}: {' '.join(str(e).split())}"[:400]
    seconds, p = time.monotonic() - t0, run.profile
    rec = record_header(hardware=run.hardware, profile=p.name, config=dict(
        budget_s=run.args.budget_s, device=str(run.device), width=p.width, batch_size=p.batch_size))
    rec.update(stage=name, index=STAGES.index(name) + 1, status=status, seconds=round(seconds, 3),
               estimate_s=ESTIMATE_S[name], elapsed_s=round(time.time() - run.start, 1),
               run_id=run_id, device=str(run.device),   # figures as JSON: NaN becomes null
               figures=json.loads(json.dumps(figures, default=str), parse_constant=lambda c: None))
    if status != "ok":
        rec["reason" if status == "skipped" else "error"] = note
    append(run.out, rec)
    print(f"[{STAGES.index(name) + 1}/{len(STAGES)}] {name}: {status} in {seconds:.1f} s "
          f"(estimate {ESTIMATE_S[name]} s): {note}", flush=True)
    return status


def parse_args(argv=None) -> argparse.Namespace:
    p = Parser(prog="gpu_check", description=__doc__.splitlines()[0])
    p.add_argument("--budget-s", type=POSITIVE_NUMBER, default=480.0, help="seconds in all")
    p.add_argument("--out", help="the stage records (default runs/gpu_<device>.jsonl); "
                                 "precision.json and the run and drop stores go beside it")
    p.add_argument("--profile", choices=list(PROFILES), default="full", help="the sizes")
    p.add_argument("--spec", choices=list(DEVICES),
                   help="with --dry-run on a machine without CUDA: plan as if this GPU were here")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    return p.parse_args(argv)


def main(argv=None, started: Optional[float] = None) -> int:
    """Run the stages; `started`: when the budget's clock started (default: now)."""
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda:0" if cuda else "cpu")
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    slug = re.sub("[^a-z0-9]+", "-", name.lower())
    assumed = bool(args.dry_run and args.spec and not cuda)
    run = Run(args, get_profile(args.profile), device, cuda or assumed,
              f"{args.spec} (assumed)" if assumed else describe_devices([device]),
              Path(args.out or f"runs/gpu_{slug}.jsonl"), slug, started or time.time())
    if args.dry_run:
        print_plan(run)
    try:       # every output, before any stage (a --dry-run says it too)
        for path, kind in ((run.out, "gpu_check stage"), (run.beside("run"), "run"),
                           (run.beside("drop"), "drop")):
            check_writable(path, store=True, kind=kind)
        check_writable(run.out.parent / "precision.json")
    except (ResultsError, OSError) as e:
        print(f"gpu_check: error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        return 0
    print(f"gpu_check: {run.hardware}, profile {run.profile.name}, {args.budget_s:.0f} s; "
          f"records to {run.out}", flush=True)
    run_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    try:
        statuses = [run_stage(run, name, run_id) for name in STAGES]
    except (ResultsError, OSError) as e:     # a record that could not be stored (a full disk)
        print(f"gpu_check: error: {e}", file=sys.stderr)
        return 2
    print(f"gpu_check: done in {time.time() - run.start:.0f} s: " + ", ".join(
        f"{statuses.count(s)} {s}" for s in ("ok", "failed", "skipped")), flush=True)
    return 1 if "failed" in statuses else 0


if __name__ == "__main__":
    sys.exit(main(started=psutil.Process().create_time()))
