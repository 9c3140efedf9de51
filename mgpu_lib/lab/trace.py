"""DDP's communication on a timeline: a few steps on N processes under `torch.profiler`.

    python -m mgpu_lib trace --nprocs 2 --profile smoke --bucket-cap-mb 0.1 --out runs/trace

Each rank trains a few steps of the book's ResNet-18 on random batches of the right shape (the
timing does not depend on pixel values) for each `Variant` (a bucket cap, a number of micro-batches
under `no_sync`). The profiler's schedule skips the first steps (DDP rebuilds its buckets after
the first one), then records `active` steps and writes one Chrome trace per rank and variant
(`OUT/<variant>/rank<r>.json`, open it in https://ui.perfetto.dev); `events.read_trace` reads
them back. With gloo the all-reduces run on gloo's own threads, beside the backward ops; with NCCL,
on a CUDA stream of their own. On two or more GPUs `trace_dataparallel` traces DataParallel's
step too: scatter, replicate, parallel_apply, gather, and the reduce in backward.
"""
from __future__ import annotations

import functools
import json
import os
import re
import tempfile
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Optional, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from ..ddp import choose_backend, cpu_threads, local_batch_size
from ..devices import DeviceError, describe_devices, num_gpus
from .events import TraceRun, overlap_rows, read_trace, save_events
from ..model import num_params, resnet18
from ..training import TrainConfig, make_model

ONE_BUCKET_MB = 10_000.0     # a cap larger than any model here: every gradient in one bucket
# DDP's default caps (torch/nn/parallel/distributed.py): 25 MiB a bucket, but the first bucket
# only 1 MiB, so that the last layers' gradients start their all-reduce early
DEFAULT_CAP_BYTES = 25 * 2**20
FIRST_CAP_BYTES = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 2**20)
WAIT, WARMUP = 1, 1          # profiler schedule: skip the first step (buckets are rebuilt after
                             # it), warm up on the second, record the rest


@dataclass(frozen=True)
class Variant:
    """One way to run DDP: a bucket cap, and micro-batches per step (all but the last under
    `no_sync`, so only the last backward all-reduces)."""
    name: str
    bucket_cap_mb: Optional[float] = None     # MiB; None: DDP's default (DEFAULT_CAP_BYTES,
                                              # the first bucket FIRST_CAP_BYTES)
    accumulate: int = 1


def default_variants(width: int) -> list:
    """Six buckets, one bucket, and one bucket with two micro-batches under `no_sync`."""
    grad_mb = num_params(resnet18(width=width)) * 4 / 2**20
    small = round(grad_mb / 6, 3)
    return [Variant(f"buckets of {small:g} MiB", small), Variant("one bucket", ONE_BUCKET_MB),
            Variant("no_sync, 2 micro-batches", ONE_BUCKET_MB, accumulate=2)]


def default_bucket_bytes(width: int) -> list:
    """The buckets DDP forms by default for `resnet18(width)`, in bytes: gradients in backward's
    order (the last layer's first), each bucket closed once it reaches its cap (the first one
    FIRST_CAP_BYTES, the rest DEFAULT_CAP_BYTES). DDP's real order differs by a few tensors."""
    buckets, size = [], 0
    for p in reversed(list(resnet18(width=width).parameters())):
        size += p.numel() * p.element_size()
        if size >= (DEFAULT_CAP_BYTES if buckets else FIRST_CAP_BYTES):
            buckets, size = buckets + [size], 0
    return buckets + [size] if size else buckets


# ---- running it -----------------------------------------------------------------------------------

def _steps(model, optimizer, x, y, variant: Variant, count: int, prof) -> None:
    """`count` optimizer steps, each of `variant.accumulate` micro-batches; all but the last
    micro-batch's backward run under `no_sync`, so DDP all-reduces once per step."""
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(count):
        optimizer.zero_grad(set_to_none=True)
        for micro in range(variant.accumulate):
            last = micro == variant.accumulate - 1
            with (nullcontext() if last else model.no_sync()):
                with record_function("forward"):
                    loss = loss_fn(model(x), y) / variant.accumulate
                with record_function("backward"):
                    loss.backward()
        with record_function("optimizer"):
            optimizer.step()
        prof.step()


def _trace_variant(config: TrainConfig, variant: Variant, rank: int, device, local_batch: int,
                   active: int, out: Path) -> None:
    net = make_model(config, device)
    model = DDP(net, device_ids=[device] if device.type == "cuda" else None,
                bucket_cap_mb=variant.bucket_cap_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    gen = torch.Generator().manual_seed(config.seed + rank)
    x = torch.rand(local_batch, 1, 28, 28, generator=gen).to(device)
    y = torch.randint(0, 10, (local_batch,), generator=gen).to(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda"
                                           else [])
    with profile(activities=activities, schedule=schedule(wait=WAIT, warmup=WARMUP,
                                                          active=active)) as prof:
        _steps(model, optimizer, x, y, variant, WAIT + WARMUP + active, prof)
    logged = model._get_ddp_logging_data()      # DDP's own record of its buckets
    sizes = logged.get("rebuilt_bucket_sizes") or logged.get("bucket_sizes") or ""
    meta = dict(variant=variant.name, rank=rank, num_buckets=len(str(sizes).split(",")),
                bucket_cap_mb=variant.bucket_cap_mb, accumulate=variant.accumulate,
                profile=config.profile, width=config.width, batch_size=config.batch_size,
                hardware=f"{dist.get_world_size()} x {dist.get_backend()} process(es) on "
                         f"{describe_devices([device])}")
    path = out / _folder(variant) / f"rank{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    doc = json.loads(path.read_text())
    doc.setdefault("otherData", {})["mgpu"] = meta    # the format's place for metadata
    path.write_text(json.dumps(doc, separators=(",", ":")))


def _folder(variant: Variant) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", variant.name).strip("_")


def _rank_main(rank: int, world: int, store: str, config: dict, variants: list, out: str,
               active: int, backend: str, timeout_s: float, log_dir: str) -> None:
    """One spawned rank. The profiler's C++ side writes to the process's stderr; that goes to a
    log file, so a notebook shows none of it (an exception still reaches the parent)."""
    log = os.open(os.path.join(log_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT)
    os.dup2(log, 1)
    os.dup2(log, 2)
    cfg = TrainConfig(**config)
    if backend == "nccl":
        device = torch.device(f"cuda:{rank}")
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(cpu_threads(world))
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    try:
        for v in variants:
            _trace_variant(cfg, Variant(**v), rank, device, local_batch_size(cfg.batch_size,
                                                                             world), active,
                           Path(out))
            dist.barrier()
    finally:
        dist.destroy_process_group()


def trace_ddp(config: TrainConfig, nprocs: int = 2, variants: Optional[Sequence[Variant]] = None,
              out="runs/trace", active: int = 2, backend: str = "auto",
              timeout_s: float = 300.0) -> TraceRun:
    """Trace `active` steps of each variant on `nprocs` processes; the events of every rank.

    Writes `out/<variant>/rank<r>.json` (Chrome traces) and `out/events.json` (`save_events`).
    `config.batch_size` is the global batch. The job is stopped after `timeout_s` seconds, and
    no process outlives this call.
    """
    backend = choose_backend(backend)
    local_batch_size(config.batch_size, nprocs)
    if backend == "nccl" and nprocs > num_gpus():
        raise DeviceError(f"{nprocs} nccl processes need {nprocs} GPUs; this machine has "
                          f"{num_gpus()}")
    variants = list(variants or default_variants(config.width))
    out = Path(out)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mgpu-trace-") as tmp:
        args = (nprocs, os.path.join(tmp, "store"), config.to_dict(),
                [asdict(v) for v in variants], str(out), active, backend, timeout_s, tmp)
        _spawn(args, nprocs, timeout_s, tmp)
    # the hardware as rank 0 saw it: its share of the threads, not this process's
    meta = json.loads((out / _folder(variants[0]) / "rank0.json").read_text())["otherData"]
    run = TraceRun(f"{nprocs} x {backend} process(es), each on {meta['mgpu']['hardware']}",
                   config.profile, nprocs, backend, config.width, config.batch_size,
                   time.perf_counter() - start)
    run.ranks = [read_trace(out / _folder(v) / f"rank{r}.json", v.name, r)
                 for v in variants for r in range(nprocs)]
    save_events(run, out / "events.json")
    return run


def _spawn(args: tuple, nprocs: int, timeout_s: float, log_dir: str) -> None:
    """Start the ranks, wait up to `timeout_s`, and leave none behind (timeout, error, Ctrl-C)."""
    ctx = mp.start_processes(_rank_main, args=args, nprocs=nprocs, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the traced DDP run took over {timeout_s:.0f} s and was "
                                   f"stopped; {_last_line(log_dir)}")
    except mp.ProcessRaisedException as e:
        raise RuntimeError(f"a traced DDP rank failed: {str(e).strip().splitlines()[-1]}") \
            from None
    except mp.ProcessExitedException as e:
        raise RuntimeError(f"a traced DDP rank died ({e}); {_last_line(log_dir)}") from None
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
                p.join(5)
            if p.is_alive():
                p.kill()
                p.join()


def _last_line(log_dir: str) -> str:
    lines = [line for f in sorted(Path(log_dir).glob("rank*.log"))
             for line in f.read_text(errors="replace").splitlines() if line.strip()]
    return f"last output: {lines[-1]}" if lines else "no output"


def summary_lines(run: TraceRun, overlap: Optional[float] = None) -> list:
    """A few lines for the command line: per variant, what the trace measured."""
    lines = [f"{run.hardware}, profile {run.profile}, width {run.width}, global batch "
             f"{run.batch_size}: traced in {run.seconds:.0f} s"]
    for variant, buckets, n, bwd, comm, hidden, measured, assumed in overlap_rows(run, overlap):
        lines.append(f"{variant}: {buckets} bucket(s), {n:g} all-reduce(s) per step; backward "
                     f"{bwd:g} ms, all-reduce {comm:g} ms, {measured}% of it hidden "
                     f"(model: {assumed}%)")
    return lines


def unwaited_allreduce_s(run: TraceRun, variant: str) -> float:
    """All-reduce time per step with the waiting taken out: an all-reduce's bar also counts the
    time a rank waits for its peers, so for each bucket take the shortest bar over the ranks
    (the rank that arrived last hardly waits), sum over the step, average over the steps."""
    ranks = [r for r in run.ranks if r.variant == variant]
    steps = [sum(min(bars) for bars in zip(*([e.duration for e in r.of("allreduce", s)]
                                             for r in ranks)))
             for s in range(min((r.steps for r in ranks), default=0))]
    return sum(steps) / len(steps) if steps else 0.0


# ---- DataParallel, on two or more GPUs ----------------------------------------------------------

DP_PHASES = ("scatter", "replicate", "parallel_apply", "gather")


def _marked(name: str):
    """`nn.DataParallel`'s method `name`, run inside a profiler mark of that name."""
    inner = getattr(nn.DataParallel, name)

    @functools.wraps(inner)
    def method(self, *args):
        with record_function(name):
            return inner(self, *args)
    return method


class MarkedDataParallel(nn.DataParallel):
    """`nn.DataParallel` with each phase of its forward marked in the profiler's trace."""
    scatter, replicate, parallel_apply, gather = (_marked(name) for name in DP_PHASES)


def trace_dataparallel(config: TrainConfig, out="runs/trace", active: int = 2) -> TraceRun:
    """DataParallel's step over every GPU, traced: scatter, replicate, parallel_apply, gather,
    and the gradients' reduce in backward. Needs two or more GPUs (else a DeviceError)."""
    if num_gpus() < 2:
        raise DeviceError(f"DataParallel's trace needs 2 or more GPUs; this machine has "
                          f"{num_gpus()}")
    devices = [torch.device(f"cuda:{i}") for i in range(num_gpus())]
    model = MarkedDataParallel(make_model(config, devices[0]), device_ids=devices)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    x = torch.rand(config.batch_size, 1, 28, 28, device=devices[0])
    y = torch.randint(0, 10, (config.batch_size,), device=devices[0])
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 schedule=schedule(wait=WAIT, warmup=WARMUP, active=active)) as prof:
        _steps(model, optimizer, x, y, Variant("DataParallel"), WAIT + WARMUP + active, prof)
    path = Path(out) / "DataParallel" / "rank0.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return TraceRun(f"DataParallel on {describe_devices(devices)}", config.profile, 1, "cuda",
                    config.width, config.batch_size, 0.0, [read_trace(path, "DataParallel", 0)])
