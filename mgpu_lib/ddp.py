"""DistributedDataParallel: one process per device, gradients all-reduced during backward.

    torchrun --nproc_per_node=2 -m mgpu_lib.ddp --profile smoke --epochs 3 --batch-size 64 --lr 0.05
    python -m mgpu_lib train --strategy ddp --nprocs 2 --profile smoke --checkpoint ckpt --resume

The difference from `train.train` is small on purpose: a process group, a `DistributedSampler`
shard of the data per rank, the model wrapped in `DistributedDataParallel`, and rank 0 alone
evaluating, logging and saving. Without CUDA the backend is gloo and each process gets its share
of the CPU threads, so N processes act as N "virtual devices".
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from contextlib import redirect_stdout
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

from .data import DeviceLoader, load_subsets
from .devices import describe_devices, num_gpus, DeviceError
from .perf import prepare_model, resolve_switches
from .supervise import LOG, LaunchError, failure_message, supervise
from .train import (TrainConfig, TrainResult, diverged, evaluate_accuracy, make_model,
                    synchronize, train_epoch, write_json_atomic)

CKPT_NAME = "last.pt"
CKPT_FORMAT = 1
# A checkpoint continues only the run it came from: these settings must match (epochs may grow).
CKPT_KEYS = ("batch_size", "lr", "seed", "width", "train_limit", "test_limit", "data_source")


class CheckpointError(ValueError):
    """A checkpoint that is unreadable, truncated, or from a different run."""


# ---- pure arithmetic --------------------------------------------------------------------------

def choose_backend(backend: str = "auto") -> str:
    """`nccl` where CUDA exists, `gloo` elsewhere (`auto`), or the one asked for."""
    if backend not in ("auto", "nccl", "gloo"):
        raise ValueError(f"backend must be auto, nccl or gloo, got {backend!r}")
    if backend == "auto":
        return "nccl" if num_gpus() > 0 else "gloo"
    return backend


def local_batch_size(global_batch: int, world_size: int) -> int:
    """Each rank's share of the global batch; an uneven split is a ValueError."""
    if world_size < 1:
        raise ValueError(f"number of processes must be positive, got {world_size}")
    if global_batch % world_size:
        raise ValueError(f"batch size {global_batch} does not split evenly over {world_size} "
                         f"processes; use a multiple of {world_size}")
    return global_batch // world_size


def cpu_threads(world_size: int, cpus: Optional[int] = None) -> int:
    """Threads per process on CPU: an equal share of the cores, at least 1."""
    return max(1, (cpus or os.cpu_count() or 1) // world_size)


def shard_indices(n: int, rank: int, world_size: int, epoch: int, seed: int = 0) -> torch.Tensor:
    """The sample indices rank `rank` trains on in `epoch` (what its `DistributedSampler` yields).

    Shards are disjoint and cover all `n` samples when `world_size` divides `n`; otherwise the
    sampler repeats up to `world_size - 1` samples so every rank runs the same number of steps.
    """
    sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=seed)
    sampler.set_epoch(epoch)    # without it every epoch would reuse the first epoch's order
    return torch.tensor(list(sampler), dtype=torch.int64)


def ring_allreduce_steps(n: int) -> list[tuple[str, list[list[int]]]]:
    """A ring all-reduce over `n` ranks, step by step: after each step, how many ranks'
    gradients rank r's copy of chunk c sums (`counts[r][c]`). n - 1 reduce-scatter steps, then
    n - 1 all-gather steps; in each, every rank sends one chunk to its right-hand neighbour."""
    counts = [[1] * n for _ in range(n)]
    steps = [("start", [row[:] for row in counts])]
    for phase, chunk_of in (("reduce-scatter", lambda i, s: (i - s) % n),
                            ("all-gather", lambda i, s: (i + 1 - s) % n)):
        for s in range(n - 1):
            sent = [(i, chunk_of(i, s), counts[i][chunk_of(i, s)]) for i in range(n)]
            for i, c, k in sent:   # all sends happen at once: read first, then write
                dest = counts[(i + 1) % n]
                dest[c] = dest[c] + k if phase == "reduce-scatter" else k
            steps.append((f"{phase} {s + 1}", [row[:] for row in counts]))
    return steps


def allreduce_bytes(num_params: int, n: int, bytes_per_param: int = 4) -> dict[str, float]:
    """Bytes one step moves over the busiest device's link: DDP's ring all-reduce sends
    2(n-1)/n of the gradients per device; DataParallel's GPU 0 sends n-1 weight copies out
    and takes n-1 gradient copies in."""
    size = num_params * bytes_per_param
    return {"ddp_ring_per_device": 2 * (n - 1) / n * size, "dp_gpu0": 2 * (n - 1) * size}


class ShardLoader:
    """This rank's batches of device-resident uint8 images, re-sharded each epoch."""

    def __init__(self, images, labels, batch_size: int, rank: int, world_size: int, seed: int,
                 source: str):
        self.images, self.labels = images, labels.to(torch.int64)
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.seed, self.source, self.epoch = seed, source, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        # Like DeviceLoader for training: a final partial batch is dropped (BatchNorm would see a
        # handful of images), unless the shard holds less than one batch.
        per_rank = math.ceil(len(self.labels) / self.world_size)
        return max(per_rank // self.batch_size, 1 if per_rank else 0)

    def __iter__(self):
        idx = shard_indices(len(self.labels), self.rank, self.world_size, self.epoch, self.seed)
        idx = idx.to(self.images.device)
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            b = idx[start:start + self.batch_size]
            yield self.images[b].unsqueeze(1).float().div_(255), self.labels[b]


# ---- checkpoints ------------------------------------------------------------------------------

def save_checkpoint(folder, net: nn.Module, optimizer, config: TrainConfig, world_size: int,
                    result: TrainResult) -> Path:
    """Write the state after `len(result.train_loss)` epochs: a temporary file, then a rename."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {"format": CKPT_FORMAT, "epoch": len(result.train_loss),
             "config": {k: getattr(config, k) for k in CKPT_KEYS}, "world_size": world_size,
             "model": net.state_dict(), "optimizer": optimizer.state_dict(),
             "rng": torch.get_rng_state(), "result": result.to_dict()}
    fd, tmp = tempfile.mkstemp(prefix=f".{CKPT_NAME}.", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / CKPT_NAME)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return folder / CKPT_NAME


def load_checkpoint(folder, config: TrainConfig, world_size: int) -> Optional[dict]:
    """The checkpoint in `folder`, checked against this run; None if there is none.

    Raises:
        CheckpointError: the file is truncated or corrupt, or belongs to a different run.
    """
    path = Path(folder) / CKPT_NAME
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:         # zip, pickle and EOF errors: all mean "not a whole file"
        first = (str(e).splitlines() or [type(e).__name__])[0][:120]
        raise CheckpointError(f"checkpoint {path.name} in {Path(folder).name!r} is truncated "
                              f"or corrupt ({first}); delete it or run without --resume") from None
    if not isinstance(state, dict) or state.get("format") != CKPT_FORMAT:
        raise CheckpointError(f"checkpoint {path.name} is not an mgpu_lib DDP checkpoint "
                              f"(format {CKPT_FORMAT})")
    want = {k: getattr(config, k) for k in CKPT_KEYS}
    diff = [f"{k} {state['config'].get(k)!r} != {v!r}" for k, v in want.items()
            if state["config"].get(k) != v]
    if state["world_size"] != world_size:
        diff.append(f"world size {state['world_size']} != {world_size}")
    if diff:
        raise CheckpointError(f"checkpoint {path.name} belongs to a different run: "
                              f"{'; '.join(diff)}")
    return state


def restore(state: dict, net: nn.Module, optimizer, result: TrainResult) -> int:
    """Load a checked checkpoint into `net`, `optimizer` and `result`; return its epoch.

    Every tensor's name and shape is checked before anything is copied, so a mismatch leaves
    the model untouched rather than half-loaded.
    """
    own = net.state_dict()
    theirs = state["model"]
    bad = sorted(set(own) ^ set(theirs)) or [k for k in own if own[k].shape != theirs[k].shape]
    if bad:
        raise CheckpointError(f"checkpoint model does not match this model (first: {bad[0]})")
    net.load_state_dict(theirs)
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])   # nothing here draws random numbers yet; dropout would
    for key in ("test_acc", "train_loss", "train_acc", "epoch_seconds", "images_per_second"):
        setattr(result, key, list(state["result"][key]))
    result.extra["resumed_from_epoch"] = state["epoch"]
    return state["epoch"]


# ---- one rank ---------------------------------------------------------------------------------

def run(config: TrainConfig, *, backend: str = "auto", checkpoint=None, resume: bool = False,
        out=None, timeout_s: float = 1800, threads: Optional[int] = None
        ) -> Optional[TrainResult]:
    """Train as one rank of a torchrun job (RANK, WORLD_SIZE, LOCAL_RANK in the environment).

    On CPU each process uses `threads` threads, by default its share of this node's cores.
    Returns the `TrainResult` on rank 0 and None elsewhere; rank 0 also writes it to `out`.
    """
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend = choose_backend(backend)
    local_batch = local_batch_size(config.batch_size, world)   # fail before any rendezvous
    if backend == "nccl":
        device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}")
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(threads or cpu_threads(int(os.environ.get("LOCAL_WORLD_SIZE",
                                                                         world))))
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    try:
        result = _fit(config, rank, world, backend, device, local_batch, checkpoint, resume)
        if rank == 0 and out:
            result.save(out)
        return result if rank == 0 else None
    finally:
        dist.destroy_process_group()


def _load_shards(config: TrainConfig, rank: int, world: int, local_batch: int, device):
    if rank != 0:
        dist.barrier()               # rank 0 downloads (if needed) before the others read
    with redirect_stdout(StringIO() if rank else sys.stdout):   # one "synthetic" notice
        xtr, ytr, xte, yte, origin = load_subsets(config.data_source, None,
                                                  config.allow_synthetic, config.train_limit,
                                                  config.test_limit)
    if rank == 0:
        dist.barrier()
    train_iter = ShardLoader(xtr.to(device), ytr.to(device), local_batch, rank, world,
                             config.seed, origin)
    test_iter = DeviceLoader(xte, yte, config.batch_size, shuffle=False, device=device,
                             source=origin)
    return train_iter, test_iter


def _fit(config, rank, world, backend, device, local_batch, checkpoint, resume) -> TrainResult:
    train_iter, test_iter = _load_shards(config, rank, world, local_batch, device)
    # The fast path's layout and precision, as in train(); the shards here are always on the device.
    switches = resolve_switches(config, device)
    # same seed on every rank; DDP also broadcasts rank 0's weights
    net = prepare_model(make_model(config, device), switches)
    model = DDP(net, device_ids=[device] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    loss_fn = nn.CrossEntropyLoss()
    result = TrainResult(
        config=config.to_dict(), hardware=f"DDP, {world} x {backend} process(es) on "
        f"{describe_devices([device])}", num_devices=world, data_source=train_iter.source,
        steps_per_epoch=len(train_iter),
        extra={"strategy": "ddp", "world_size": world, "backend": backend,
               "local_batch_size": local_batch, "threads_per_process": torch.get_num_threads(),
               "switches": switches.to_dict()})
    start = 0
    state = load_checkpoint(checkpoint, config, world) if checkpoint and resume else None
    if state is not None:
        start = restore(state, net, optimizer, result)
    elif resume and rank == 0:
        print(f"{LOG}no checkpoint to resume from; starting at epoch 1", flush=True)
    for epoch in range(start, config.num_epochs):
        if not _epoch(model, net, train_iter, test_iter, optimizer, loss_fn, device, epoch,
                      result, rank, switches):
            break
        if rank == 0 and checkpoint:
            save_checkpoint(checkpoint, net, optimizer, config, world, result)
    if rank == 0:
        print(LOG + result.summary(), flush=True)
    return result


def _epoch(model, net, train_iter, test_iter, optimizer, loss_fn, device, epoch, result,
           rank, switches=None) -> bool:
    """One epoch on every rank; rank 0 evaluates and logs. False once the run diverged."""
    train_iter.set_epoch(epoch)
    dist.barrier()                   # start the clock together (rank 0 was evaluating)
    t0 = time.perf_counter()
    loss_sum, correct, n = train_epoch(model, train_iter, optimizer, loss_fn, device,
                                       switches=switches)
    stats = torch.stack([loss_sum.double(), correct.double(),
                         torch.tensor(float(n), dtype=torch.float64, device=device)])
    dist.all_reduce(stats)           # every rank sees the same totals, so all stop together
    synchronize([device])
    seconds = time.perf_counter() - t0
    loss, acc, total = stats[0].item() / stats[2].item(), stats[1].item() / stats[2].item(), \
        stats[2].item()
    result.train_loss.append(loss)
    if diverged(loss):
        result.status = "diverged"
        return False
    result.train_acc.append(acc)
    result.epoch_seconds.append(seconds)
    result.images_per_second.append(total / seconds)
    if rank == 0:                    # the unwrapped net: evaluation needs no collectives
        result.test_acc.append(evaluate_accuracy(net, test_iter, switches=switches))
        print(f"{LOG}epoch {epoch + 1}/{result.config['num_epochs']}: loss {loss:.3f}, "
              f"train acc {acc:.3f}, test acc {result.test_acc[-1]:.3f}, {seconds:.2f} s",
              flush=True)
    return True


# ---- the launcher -----------------------------------------------------------------------------

def launch(config: TrainConfig, nprocs: int, *, backend: str = "auto", timeout_s: float = 3600,
           checkpoint=None, resume: bool = False, progress: bool = True) -> TrainResult:
    """Run `config` as a torchrun job of `nprocs` processes on this machine; rank 0's result.

    Args:
        config: what to train; `batch_size` is the global batch, split evenly over the ranks.
        nprocs: processes (one per GPU with nccl; "virtual devices" sharing the CPU with gloo).
        backend: "auto" (nccl with CUDA, gloo without), "nccl" or "gloo".
        timeout_s: the whole job's limit; past it every process is stopped.
        checkpoint: a folder for per-epoch checkpoints; `resume` continues from the last one.
        progress: echo rank 0's progress lines as they arrive.
    Raises:
        LaunchError: a rank failed or the job timed out (the message names the rank and error).
    """
    backend = choose_backend(backend)
    local_batch_size(config.batch_size, nprocs)          # refuse bad input before starting
    if backend == "nccl" and nprocs > num_gpus():
        raise DeviceError(f"{nprocs} nccl processes need {nprocs} GPUs; this machine has "
                          f"{num_gpus()}")
    if checkpoint and resume:
        load_checkpoint(checkpoint, config, nprocs)      # a bad checkpoint: one line, now
    with tempfile.TemporaryDirectory(prefix="mgpu-ddp-") as tmp:
        cfg, out = Path(tmp) / "config.json", Path(tmp) / "result.json"
        write_json_atomic(cfg, config.to_dict())
        args = ["--config", str(cfg), "--out", str(out), "--backend", backend,
                "--timeout", str(timeout_s)]
        if checkpoint:
            args += ["--checkpoint", str(checkpoint)] + (["--resume"] if resume else [])
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nprocs}", "--max-restarts=0", "-m", "mgpu_lib.ddp", *args]
        env = dict(os.environ, PYTHONUNBUFFERED="1",
                   OMP_NUM_THREADS=str(cpu_threads(nprocs)) if backend == "gloo" else "1")
        code, tail = supervise(cmd, env, timeout_s, progress)
        if code != 0:
            raise LaunchError(failure_message(code, tail))
        return TrainResult.load(out)


# ---- the torchrun entry point -----------------------------------------------------------------

def main(argv=None) -> int:
    """`torchrun ... -m mgpu_lib.ddp [train flags]`: argparse stays thin and delegates."""
    from .__main__ import (Parser, add_train_args, config_from_args, positive_float,
                           positive_int)
    from .data import DataError
    p = Parser(prog="torchrun --nproc_per_node=N -m mgpu_lib.ddp",
               description="Train with DistributedDataParallel, one process per device.")
    add_train_args(p)
    p.add_argument("--checkpoint", help="folder for a checkpoint after every epoch")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint")
    p.add_argument("--backend", default="auto", choices=["auto", "nccl", "gloo"])
    p.add_argument("--timeout", type=positive_float, default=1800.0,
                   help="seconds a collective may wait for a silent rank")
    p.add_argument("--threads", type=positive_int,
                   help="CPU threads per process (default: its share of this node's cores)")
    p.add_argument("--config", help=argparse.SUPPRESS)   # `launch` passes its exact config
    args = p.parse_args(argv)
    if "RANK" not in os.environ:
        p.error("run this under torchrun: torchrun --nproc_per_node=N -m mgpu_lib.ddp ...")
    if args.devices is not None:
        p.error("--devices does not apply: torchrun's --nproc_per_node sets the processes")
    rank = os.environ["RANK"]
    try:
        config = (TrainConfig(**json.loads(Path(args.config).read_text())) if args.config
                  else config_from_args(args))
        result = run(config, backend=args.backend, checkpoint=args.checkpoint,
                     resume=args.resume, out=args.out, timeout_s=args.timeout,
                     threads=args.threads)
    except (ValueError, DataError, DeviceError) as e:     # CheckpointError is a ValueError
        print(f"mgpu_lib.ddp rank {rank}: error: {e}", file=sys.stderr, flush=True)
        return 2
    return 3 if result is not None and result.status != "ok" else 0


if __name__ == "__main__":
    sys.exit(main())
