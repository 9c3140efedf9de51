"""DistributedDataParallel: one process per device, gradients all-reduced during backward.

    python -m mgpu_lib train --strategy ddp --nprocs 2 --profile smoke --checkpoint ckpt --resume
    torchrun --nproc_per_node=2 -m mgpu_lib worker --profile smoke --epochs 3 --batch-size 64

The difference from `training.train` is small on purpose: a process group, a `DistributedSampler`
shard of the data per rank, the model wrapped in `DistributedDataParallel`, and rank 0 alone
evaluating, logging and saving; the epoch loop is `training.fit`. Without CUDA the backend is gloo
and each process gets its share of the CPU threads, so N processes act as N "virtual devices".
"""
from __future__ import annotations

import io
import json
import os
import textwrap
from datetime import timedelta
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

from .data import DataError, DeviceLoader, load_subsets, shard_indices  # noqa: F401 (page 05)
from .devices import DeviceError, describe_devices, num_gpus
from .config import prepare_model, resolve_switches
from .training import (METRICS, TrainConfig, TrainResult, evaluate_accuracy, fit, make_model,
                       make_step, not_a_file, write_atomic)

CKPT_NAME = "last.pt"
CKPT_FORMAT = 1
# A checkpoint continues only the run it came from: these settings must match (epochs may grow).
CKPT_KEYS = ("batch_size", "lr", "seed", "width", "train_limit", "test_limit", "data_source")
# What a checkpoint holds; `restore` reads every one of them.
CKPT_ENTRIES = ("format", "epoch", "config", "world_size", "model", "optimizer", "rng", "result")
# A collective waits this long for a silent rank (a stopped or hung process) before failing.
# Long enough for rank 0's evaluation at the end of an epoch, short enough to notice a hang.
COLLECTIVE_TIMEOUT_S = 300.0


class CheckpointError(ValueError):
    """A checkpoint that is unreadable, truncated, or from a different run."""


class RankInputError(ValueError):
    """A rank refused its input (bad data, a bad checkpoint): a user error, said in one line by
    the launcher, which reads it from the rank's error file."""


# ---- pure arithmetic --------------------------------------------------------------------------

def choose_backend(backend: str = "auto") -> str:
    """`nccl` where CUDA and NCCL exist, `gloo` elsewhere (`auto`), or the one asked for.
    Windows and macOS builds of torch have no NCCL ("Windows supports all collective
    communications backend but NCCL", pytorch.org/docs/stable/distributed), so DDP there is
    gloo processes on the CPU, GPUs or not."""
    if backend not in ("auto", "nccl", "gloo"):
        raise ValueError(f"backend must be auto, nccl or gloo, got {backend!r}")
    if backend == "auto":
        return "nccl" if num_gpus() > 0 and dist.is_nccl_available() else "gloo"
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


# ---- checkpoints ------------------------------------------------------------------------------

def save_checkpoint(folder, net: nn.Module, optimizer, config: TrainConfig, world_size: int,
                    result: TrainResult) -> Path:
    """Write the state after `len(result.train_loss)` epochs: a temporary file, then a rename."""
    folder = Path(folder)
    state = {"format": CKPT_FORMAT, "epoch": len(result.train_loss),
             "config": {k: getattr(config, k) for k in CKPT_KEYS}, "world_size": world_size,
             "model": net.state_dict(), "optimizer": optimizer.state_dict(),
             "rng": torch.get_rng_state(),
             # plain JSON types: torch.load(weights_only=True) refuses others (a TorchVersion)
             "result": json.loads(json.dumps(result.to_dict()))}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return write_atomic(checkpoint_file(folder), buffer.getvalue())


def checkpoint_file(folder) -> Path:
    """`folder`'s checkpoint, where saves go: through a link, to the file it points to. A
    CheckpointError if something else is there (a FIFO, a device, a folder, a link to nothing),
    which a save would replace."""
    path = Path(folder) / CKPT_NAME
    if what := not_a_file(path):
        raise CheckpointError(f"{path} is {what}, and a checkpoint would replace it; name "
                              f"another --checkpoint folder")
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def remove_partial_checkpoints(folder) -> None:
    """Delete what saves killed midway left (`save_checkpoint`'s temporary files)."""
    for tmp in checkpoint_file(folder).parent.glob(f".{CKPT_NAME}.*"):
        tmp.unlink(missing_ok=True)


def check_fresh(folder) -> None:
    """Refuse to start a run (not `--resume`) over a checkpoint that is already in `folder`."""
    if folder and checkpoint_file(folder).exists():
        raise CheckpointError(f"{Path(folder) / CKPT_NAME} exists (from an earlier run); use "
                              f"--resume to continue it, or another --checkpoint folder")


def load_checkpoint(folder, config: TrainConfig, world_size: int) -> Optional[dict]:
    """The checkpoint in `folder`, checked against this run; None if there is none. A
    CheckpointError if it is truncated or corrupt, belongs to a different run, or holds more
    epochs than `config.num_epochs` (resuming it would train nothing and report more epochs than
    were asked for)."""
    path = checkpoint_file(folder)
    if not path.is_file():
        return None
    state = _read_checkpoint(path)
    want = {k: getattr(config, k) for k in CKPT_KEYS}
    diff = [f"{k} {state['config'].get(k)!r} != {v!r}" for k, v in want.items()
            if state["config"].get(k) != v]
    if state["world_size"] != world_size:
        diff.append(f"world size {state['world_size']} != {world_size}")
    if diff:
        raise CheckpointError(f"checkpoint {path.name} belongs to a different run: "
                              f"{'; '.join(diff)}")
    if state["epoch"] > config.num_epochs:
        raise CheckpointError(f"checkpoint {path} has {state['epoch']} epochs, more than "
                              f"--epochs {config.num_epochs} (num_epochs); resume with "
                              f"--epochs {state['epoch']} or more")
    return state


def _read_checkpoint(path: Path) -> dict:
    """The whole dict in `path`, with every entry `restore` reads, else a CheckpointError."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:         # zip, pickle and EOF errors: all mean "not a whole file"
        first = textwrap.shorten((str(e).splitlines() or [type(e).__name__])[0], 120,
                                 placeholder=" ...")
        raise CheckpointError(f"checkpoint {path.name} in {path.parent.name!r} is truncated "
                              f"or corrupt ({first}); delete it or run without --resume") from None
    problem = _checkpoint_problem(state)
    if problem:
        raise CheckpointError(f"checkpoint {path} is not an mgpu_lib DDP checkpoint of format "
                              f"{CKPT_FORMAT} ({problem}); delete it or run without --resume")
    return state


def _checkpoint_problem(state) -> Optional[str]:
    """What keeps `state` from being restored (so that `restore` meets no KeyError), or None."""
    if not isinstance(state, dict):
        return f"it holds a {type(state).__name__}, not a dict"
    missing = [k for k in CKPT_ENTRIES if k not in state]
    if missing:
        return f"no {', '.join(missing)}"
    if state["format"] != CKPT_FORMAT:
        return f"format {state['format']!r}"
    if not isinstance(state["config"], dict) or not isinstance(state["epoch"], int) or \
            not isinstance(state["result"], dict) or any(m not in state["result"] for m in METRICS):
        return "a malformed config, epoch or result"
    if state["epoch"] < 0 or any(len(state["result"][m]) != state["epoch"] for m in METRICS):
        return f"epoch {state['epoch']} does not match its {len(state['result']['train_loss'])} " \
               f"recorded epochs"
    optimizer = state["optimizer"]
    if not isinstance(state["model"], dict) or not isinstance(optimizer, dict) or \
            any(k not in optimizer for k in ("state", "param_groups")):
        return "no model or optimizer state"
    return None


def restore(state: dict, net: nn.Module, optimizer, result: TrainResult) -> int:
    """Load a checked checkpoint into `net`, `optimizer` and `result`; return its epoch. Every
    tensor's name and shape is checked before anything is copied, so a mismatch leaves the model
    untouched rather than half-loaded."""
    own = net.state_dict()
    theirs = state["model"]
    bad = sorted(set(own) ^ set(theirs)) or [k for k in own if own[k].shape != theirs[k].shape]
    if bad:
        raise CheckpointError(f"checkpoint model does not match this model (first: {bad[0]})")
    net.load_state_dict(theirs)
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])   # nothing here draws random numbers yet; dropout would
    for key in METRICS:
        setattr(result, key, list(state["result"][key]))
    result.extra["resumed_from_epoch"] = state["epoch"]
    return state["epoch"]


# ---- one rank ---------------------------------------------------------------------------------

@record     # an exception goes to this rank's TORCHELASTIC_ERROR_FILE, for `launcher.failure`
def run(config: TrainConfig, **kw) -> Optional[TrainResult]:
    """Train as one rank of a torchrun job (RANK, WORLD_SIZE, LOCAL_RANK in the environment);
    keywords as `_run`. Bad input (missing data, a bad checkpoint) is raised as a
    `RankInputError`, so that the launcher reads a user error from the rank's error file."""
    try:
        return _run(config, **kw)
    except (ValueError, DataError, DeviceError) as e:
        raise RankInputError(str(e)) from e


def _run(config: TrainConfig, *, backend: str = "auto", checkpoint=None, resume: bool = False,
         timeout_s: float = COLLECTIVE_TIMEOUT_S, threads: Optional[int] = None,
         log: Optional[Callable[[str], None]] = None) -> Optional[TrainResult]:
    """On CPU each process uses `threads` threads, by default its share of this node's cores.
    `timeout_s` bounds how long a collective waits for a silent rank. Returns the `TrainResult`
    on rank 0 (which also calls `log` with its progress lines), else None."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if checkpoint and not resume:
        check_fresh(checkpoint)      # before any rendezvous: every rank refuses alike
    if checkpoint and rank == 0:     # rank 0 alone saves, and is not saving yet
        remove_partial_checkpoints(checkpoint)
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
    # No `finally`: after an exception the process exits, and destroying the group first could
    # wait on a peer, delaying the error file that tells the launcher which rank failed.
    result = _fit(config, rank, world, backend, device, local_batch, checkpoint, resume,
                  log if rank == 0 else None)
    dist.destroy_process_group()
    return result if rank == 0 else None


def _load_shards(config: TrainConfig, rank: int, world: int, local_batch: int, device):
    if rank != 0:
        dist.barrier()               # rank 0 downloads (if needed) before the others read
    xtr, ytr, xte, yte, origin = load_subsets(config.data_source, None, config.allow_synthetic,
                                              config.train_limit, config.test_limit)
    if rank == 0:
        dist.barrier()
    train_iter = DeviceLoader(xtr, ytr, local_batch, shuffle=True, device=device,
                              seed=config.seed, source=origin, drop_last=True, rank=rank,
                              world_size=world)
    test_iter = DeviceLoader(xte, yte, config.batch_size, shuffle=False, device=device,
                             source=origin)
    return train_iter, test_iter


def _fit(config, rank, world, backend, device, local_batch, checkpoint, resume, log
         ) -> TrainResult:
    train_iter, test_iter = _load_shards(config, rank, world, local_batch, device)
    switches = resolve_switches(config, device)   # the fast path's layout and precision
    # same seed on every rank; DDP also broadcasts rank 0's weights
    net = prepare_model(make_model(config, device), switches)
    model = DDP(net, device_ids=[device] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    result = TrainResult.create(
        config, hardware=f"DDP, {world} {backend} process{'es' if world > 1 else ''}, each on "
        f"{describe_devices([device])}", num_devices=world, data_source=train_iter.source,
        steps_per_epoch=len(train_iter),
        extra={"strategy": "ddp", "world_size": world, "backend": backend,
               "local_batch_size": local_batch, "threads_per_process": torch.get_num_threads(),
               "switches": switches.to_dict()})
    start = 0
    state = load_checkpoint(checkpoint, config, world) if checkpoint and resume else None
    if state is not None:
        start = restore(state, net, optimizer, result)
    elif resume and log:
        log("no checkpoint to resume from; starting at epoch 1")

    def before_epoch(epoch: int) -> None:
        train_iter.set_epoch(epoch)
        dist.barrier()               # start the clock together (rank 0 was evaluating)

    def on_epoch(r: TrainResult) -> None:
        if checkpoint:
            save_checkpoint(checkpoint, net, optimizer, config, world, r)
        if log:
            log(f"epoch {len(r.train_loss)}/{config.num_epochs}: loss {r.train_loss[-1]:.3f}, "
                f"train acc {r.train_acc[-1]:.3f}, test acc {r.test_acc[-1]:.3f}, "
                f"{r.epoch_seconds[-1]:.2f} s")

    fit(make_step(model, optimizer, nn.CrossEntropyLoss(), device, switches), train_iter, result,
        model=model, num_epochs=config.num_epochs, devices=[device], start_epoch=start,
        # every rank sees the same totals, so all of them stop together on a divergence
        reduce=dist.all_reduce, before_epoch=before_epoch,
        # the unwrapped net: evaluation needs no collectives
        evaluate=(lambda: evaluate_accuracy(net, test_iter, switches=switches))
        if rank == 0 else None,
        on_epoch=on_epoch if rank == 0 else None)
    if log:
        log(result.summary())
    return result
