"""DDP's communication on a timeline: a few steps on N processes under `torch.profiler`.

    python -m mgpu_lib trace --nprocs 2 --profile smoke --bucket-cap-mb 0.1 --out runs/trace

Each rank trains a few steps of the book's ResNet-18 on random batches of the right shape (the
timing does not depend on pixel values) for each `Variant`, and writes one Chrome trace per rank
and variant (open it in https://ui.perfetto.dev). With gloo the all-reduces run on gloo's own
threads, beside the backward ops; with NCCL, on a CUDA stream of their own.
"""
from __future__ import annotations

import functools
import json
import re
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from ..ddp import choose_backend, local_batch_size, setup, write_atomic
from ..devices import describe_devices, num_gpus
from ..model import num_params, resnet18
from ..training import TrainConfig, make_model
from .events import TraceRun, overlap_rows, read_trace
from .launcher import check_nprocs, job_folder, rank_env, run_ranks

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
    bucket_cap_mb: Optional[float] = None     # MiB; None: DDP's defaults (DEFAULT_CAP_BYTES)
    accumulate: int = 1


def default_variants(width: int) -> list:
    """Six buckets, one bucket, and one bucket with two micro-batches under `no_sync`."""
    small = round(num_params(resnet18(width=width)) * 4 / 2**20 / 6, 3)   # MiB of fp32 gradients
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

def _profile(model, config: TrainConfig, variant: Variant, device, batch: int, active: int,
             seed: Optional[int] = None) -> profile:
    """The profiler after WAIT + WARMUP + `active` optimizer steps on one random batch, each of
    `variant.accumulate` micro-batches."""
    optimizer, loss_fn = torch.optim.SGD(model.parameters(), lr=config.lr), nn.CrossEntropyLoss()
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    x = torch.rand(batch, 1, 28, 28, generator=gen).to(device)
    y = torch.randint(0, 10, (batch,), generator=gen).to(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, schedule=schedule(wait=WAIT, warmup=WARMUP,
                                                          active=active)) as prof:
        for _ in range(WAIT + WARMUP + active):
            optimizer.zero_grad(set_to_none=True)
            for micro in range(variant.accumulate):
                with (model.no_sync() if micro < variant.accumulate - 1 else nullcontext()):
                    with record_function("forward"):
                        loss = loss_fn(model(x), y) / variant.accumulate
                    with record_function("backward"):
                        loss.backward()
            with record_function("optimizer"):
                optimizer.step()
            prof.step()
    return prof


def _save(prof, meta: dict, path: Path) -> None:
    """`prof`'s Chrome trace with `meta` in it, at `path` in the job's folder: the profiler's
    writer can leave a torn file, which goes with the folder; `trace_ddp` copies it out whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc.setdefault("otherData", {})["mgpu"] = meta    # the format's place for metadata
    path.write_text(json.dumps(doc, separators=(",", ":")), encoding="utf-8")


def _trace_file(out, variant: Variant, rank: int) -> Path:
    """Where rank `rank`'s Chrome trace of `variant` goes: OUT/<variant>/rank<r>.json."""
    folder = re.sub(r"[^A-Za-z0-9.]+", "_", variant.name).strip("_")
    return Path(out) / folder / f"rank{rank}.json"


@record     # an exception goes to this rank's error file, where the launcher reads it
def trace_rank(spec_path: str) -> None:
    """One rank of `trace_ddp`'s job (`python -m mgpu_lib.lab.trace SPEC` under torchrun),
    joined as the DDP program's ranks join (`ddp.setup`): every variant, in the order given,
    its traces written into the job's folder."""
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    cfg = TrainConfig(**spec["config"])
    device = setup(spec["backend"], spec["timeout_s"])
    rank, world = dist.get_rank(), dist.get_world_size()
    for v in (Variant(**d) for d in spec["variants"]):
        model = DDP(make_model(cfg, device), device_ids=[device] if device.type == "cuda" else None,
                    bucket_cap_mb=v.bucket_cap_mb)
        prof = _profile(model, cfg, v, device, local_batch_size(cfg.batch_size, world),
                        spec["active"], cfg.seed + rank)
        logged = model._get_ddp_logging_data()      # DDP's own record of its buckets
        sizes = logged.get("rebuilt_bucket_sizes") or logged.get("bucket_sizes") or ""
        meta = dict(variant=v.name, rank=rank, num_buckets=len(str(sizes).split(",")),
                    bucket_cap_mb=v.bucket_cap_mb, accumulate=v.accumulate, profile=cfg.profile,
                    width=cfg.width, batch_size=cfg.batch_size,
                    hardware=describe_devices([device]), world_size=world,
                    backend=dist.get_backend())
        _save(prof, meta, _trace_file(Path(spec_path).parent / "traces", v, rank))
        dist.barrier()
    dist.destroy_process_group()


def trace_ddp(config: TrainConfig, nprocs: int = 2, variants: Optional[Sequence[Variant]] = None,
              out="runs/trace", active: int = 2, backend: str = "auto",
              timeout_s: float = 300.0) -> TraceRun:
    """Trace `active` steps of each variant on `nprocs` processes; the events of every rank.
    `config.batch_size` is the global batch. Once every rank succeeded, this process writes
    `out/<variant>/rank<r>.json` (Chrome traces) and `out/events.json` (the `TraceRun`). The
    ranks run as a DDP job does (`launcher.run_ranks`): stopped after `timeout_s` seconds, or on
    Ctrl-C, SIGTERM or SIGHUP, none outliving this call; a failed rank is a `LaunchError`."""
    backend = choose_backend(backend)
    local_batch_size(config.batch_size, nprocs)
    check_nprocs(nprocs, backend)
    variants = list(variants or default_variants(config.width))
    out, start = Path(out), time.perf_counter()
    ranks = [(v, r) for v in variants for r in range(nprocs)]
    with job_folder("mgpu-trace-") as tmp:
        spec = tmp / "trace.json"
        spec.write_text(json.dumps(dict(config=config.to_dict(), backend=backend,
                                        variants=[asdict(v) for v in variants], active=active,
                                        timeout_s=timeout_s)), encoding="utf-8")
        run_ranks(["-m", "mgpu_lib.lab.trace", str(spec)], nprocs, tmp,
                  env=rank_env(backend, nprocs), timeout_s=timeout_s)
        for v, r in ranks:
            write_atomic(_trace_file(out, v, r), _trace_file(tmp / "traces", v, r).read_bytes())
    # the hardware as rank 0 saw it: its share of the threads, not this process's
    meta = json.loads(_trace_file(out, variants[0], 0).read_text(encoding="utf-8"))["otherData"]
    noun = "process" if nprocs == 1 else "processes"
    run = TraceRun(f"{nprocs} {backend} {noun}, each on {meta['mgpu']['hardware']}",
                   config.profile, nprocs, backend, config.width, config.batch_size,
                   time.perf_counter() - start)
    run.ranks = [read_trace(_trace_file(out, v, r), v.name, r) for v, r in ranks]
    write_atomic(out / "events.json", json.dumps(asdict(run)))
    return run


def summary_lines(run: TraceRun) -> list:
    """A few lines for the command line: per variant, what the trace measured."""
    lines = [f"{run.hardware}, profile {run.profile}, width {run.width}, global batch "
             f"{run.batch_size}: traced in {run.seconds:.0f} s"]
    for variant, buckets, n, bwd, comm, hidden, measured, assumed in overlap_rows(run):
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
    scatter, replicate, parallel_apply, gather = map(_marked, ("scatter", "replicate",
                                                               "parallel_apply", "gather"))


def trace_dataparallel(config: TrainConfig, out="runs/trace", active: int = 2) -> TraceRun:
    """DataParallel's step over every GPU, traced: scatter, replicate, parallel_apply, gather,
    and the gradients' reduce in backward, on two or more GPUs."""
    devices = [torch.device(f"cuda:{i}") for i in range(num_gpus())]
    model = MarkedDataParallel(make_model(config, devices[0]), device_ids=devices)
    prof = _profile(model, config, Variant("DataParallel"), devices[0], config.batch_size, active)
    path = Path(out) / "DataParallel" / "rank0.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return TraceRun(f"DataParallel on {describe_devices(devices)}", config.profile, 1, "cuda",
                    config.width, config.batch_size, 0.0, [read_trace(path, "DataParallel", 0)])


if __name__ == "__main__":
    trace_rank(sys.argv[1])
