"""DistributedDataParallel as one program: one process per device, gradients all-reduced
during backward.

    torchrun --standalone --nproc_per_node=2 -m mgpu_lib.ddp --epochs 1 --width 8 \
        --train-limit 2000 --test-limit 500 --batch-size 32 --lr 0.05 --allow-synthetic

As in pytorch/examples' DDP series, the difference from the one-process loop (`training.train`)
is small: a process group, each rank's shard of the data, the model in `DistributedDataParallel`,
and rank 0 alone evaluating, saving and printing. Without CUDA the backend is gloo, and each
process gets its share of the CPU threads: N processes act as N "virtual devices".
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import io
import json
import os
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

from .data import DataError, DeviceLoader, load_subsets
from .devices import DeviceError, describe_devices, num_gpus
from .config import prepare_model, resolve_switches
from .training import (BN_METRICS, METRICS, PARTIAL, TrainConfig, TrainResult, backends,
                       check_out, counted, evaluate, fit, make_model,
                       make_step, progress_bar, sgd)

CKPT_NAME = "last.pt"
# A snapshot continues only the run it came from: these settings must match (epochs may grow).
CKPT_KEYS = ("batch_size", "lr", "seed", "width", "train_limit", "test_limit", "data_source")
# A collective waits this long for a silent rank (a stopped or hung process) before failing.
# Long enough for rank 0's evaluation at the end of an epoch, short enough to notice a hang.
COLLECTIVE_TIMEOUT_S = 300.0


class RankInputError(ValueError):
    """A rank refused its input (bad data, a bad checkpoint): the launcher says it in one line."""


def choose_backend(backend: str = "auto") -> str:
    """`nccl` where CUDA and NCCL exist, else `gloo` (`auto`), or the one asked for. Windows
    and macOS builds have no NCCL (pytorch.org/docs/stable/distributed): gloo on the CPU."""
    if backend == "auto":
        return "nccl" if num_gpus() > 0 and dist.is_nccl_available() else "gloo"
    return backend


def local_batch_size(global_batch: int, world_size: int) -> int:
    """Each rank's share of the global batch; an uneven split is a ValueError."""
    if global_batch % world_size:
        raise ValueError(f"batch size {global_batch} does not split evenly over {world_size} "
                         f"processes; use a multiple of {world_size}")
    return global_batch // world_size


def cpu_threads(world_size: int, cpus: Optional[int] = None) -> int:
    """Threads per process on CPU: an equal share of the cores, at least 1."""
    return max(1, (cpus or os.cpu_count() or 1) // world_size)


def save_checkpoint(folder, net: nn.Module, optimizer, result: TrainResult) -> Path:
    """Rank 0's snapshot after `len(result.train_loss)` epochs, as pytorch/examples' DDP
    tutorial saves one: the model, the optimizer, the epoch and the result so far."""
    snapshot = {"model": net.state_dict(), "optimizer": optimizer.state_dict(),
                "epoch": len(result.train_loss),
                # in plain JSON types: torch.load(weights_only=True) refuses others
                "result": json.loads(json.dumps(result.to_dict()))}
    buffer = io.BytesIO()
    torch.save(snapshot, buffer)
    return write_atomic(Path(folder) / CKPT_NAME, buffer.getvalue())


def write_atomic(path, data) -> Path:
    """Write `data` (text or bytes) to a temporary file beside `path`, then rename it over
    `path`: a reader sees the old file or the new one, never half of one, and a failed write
    (a full disk) leaves neither a torn file nor the temporary one. A link at `path` is the
    user's: the file it points to is replaced, not the link."""
    path = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
    tmp = path.with_name(f".{path.name}{PARTIAL}{os.getpid()}.{threading.get_ident()}")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())        # a full disk can show only here
        os.replace(tmp, path)
    except OSError as e:        # one that says which file (a full disk says none)
        raise OSError(e.errno, e.strerror, str(path)) from None
    finally:
        tmp.unlink(missing_ok=True)
    return path


def check_fresh(folder) -> None:
    """Refuse to start a run (not `--resume`) over a snapshot that is already in `folder`."""
    if folder and os.path.lexists(Path(folder) / CKPT_NAME):
        raise ValueError(f"{Path(folder) / CKPT_NAME} exists (from an earlier run); use "
                         f"--resume to continue it, or another --checkpoint folder")


def differences(snapshot: dict, config: TrainConfig, world_size: int) -> list[str]:
    """What keeps `snapshot` from continuing this run, e.g. ['lr was 0.05, now 0.1']: another
    setting or world size (its result says them), or more epochs done than this run asks for."""
    theirs = {**snapshot["result"]["config"], "world size": snapshot["result"]["num_devices"]}
    mine = {**{k: getattr(config, k) for k in CKPT_KEYS}, "world size": world_size}
    diff = [f"{k} was {theirs.get(k)!r}, now {v!r}" for k, v in mine.items() if theirs.get(k) != v]
    if snapshot["epoch"] > config.num_epochs:
        diff.append(f"{snapshot['epoch']} epochs done, more than --epochs {config.num_epochs}")
    return diff


def restore(folder, config: TrainConfig, world_size: int, net: nn.Module, optimizer,
            result: TrainResult) -> int:
    """Load `folder`'s snapshot into `net`, `optimizer` and `result`; its epoch (0 without
    one). A file that does not load, or another run's, is a ValueError saying why (its first
    line) or what differs."""
    path = Path(folder) / CKPT_NAME
    if not path.is_file():
        return 0
    try:
        snapshot = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:      # a torn file, a pickle: one line, not a traceback
        raise ValueError(f"{path} does not load: {type(e).__name__}: {e}") from None
    if diff := differences(snapshot, config, world_size):
        raise ValueError(f"{path} is another run's snapshot: {'; '.join(diff)}")
    net.load_state_dict(snapshot["model"])
    optimizer.load_state_dict(snapshot["optimizer"])
    for key in METRICS + BN_METRICS:
        setattr(result, key, snapshot["result"][key])
    result.extra["resumed_from_epoch"] = snapshot["epoch"]
    return snapshot["epoch"]


LOG = "rank 0: "     # rank 0's lines start with this (torchrun mixes every rank's output)
PARENT_POLL_S = 0.05     # short: an epoch that ends inside this window still saves


def exit_with_parent() -> None:
    """End this rank at once when torchrun, its parent, is gone, whatever killed it: nothing
    trains or writes after the command died (issue 52: SIGKILL to torchrun left both ranks
    training, re-parented, and writing its checkpoint). POSIX: the parent's pid changes."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)
    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def setup(backend: str = "auto", timeout_s: float = COLLECTIVE_TIMEOUT_S) -> torch.device:
    """Join the process group torchrun describes in the environment (RANK, WORLD_SIZE, ...);
    returns this rank's device: its GPU with nccl, else the CPU with its share of the cores
    (unless OMP_NUM_THREADS says). A collective waits `timeout_s` for a silent rank."""
    backend = choose_backend(backend)
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(cpu_threads(int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return device


def load_shards(config: TrainConfig, device, rank: int, world: int):
    """This rank's shard of the training data (`set_epoch` picks the epoch's) and the test set."""
    if rank != 0:
        dist.barrier()               # rank 0 downloads (if needed) before the others read
    xtr, ytr, xte, yte, origin = load_subsets(config.data_source, None, config.allow_synthetic,
                                              config.train_limit, config.test_limit)
    if rank == 0:
        dist.barrier()
    train_iter = DeviceLoader(xtr, ytr, local_batch_size(config.batch_size, world),
                              shuffle=True, device=device, seed=config.seed, source=origin,
                              drop_last=True, rank=rank, world_size=world)
    test_iter = DeviceLoader(xte, yte, config.batch_size, shuffle=False, device=device,
                             source=origin)
    return train_iter, test_iter


def train(config: TrainConfig, device, checkpoint=None, resume=False, progress=False,
          make_optimizer: Callable = sgd, readings=None) -> TrainResult:
    """Train `config` as one rank of the group `setup` joined; rank 0's result holds
    the test accuracies. Rank 0 saves a checkpoint into the folder `checkpoint` after
    every epoch; `resume` continues from it; `progress`: a bar on rank 0; `readings`: as
    `training.train`'s."""
    rank, world = dist.get_rank(), dist.get_world_size()
    switches = resolve_switches(config, device)
    train_iter, test_iter = load_shards(config, device, rank, world)
    net = prepare_model(make_model(config, device), switches)  # seeded: same weights
    model = DDP(net, device_ids=[device] if device.type == "cuda" else None)
    optimizer = make_optimizer(model.parameters(), config.lr, len(train_iter))
    result = TrainResult(config.to_dict(), describe_job(device), world,
                         data_source=getattr(train_iter, "source", "custom"),
                         steps_per_epoch=len(train_iter),
                         extra={"switches": switches.to_dict()})
    start = restore(checkpoint, config, world, net, optimizer, result) if resume else 0
    on_epoch = functools.partial(save_and_print, checkpoint, net, optimizer)
    step = make_step(model, optimizer, nn.CrossEntropyLoss(), device, switches)
    epochs = range(start, config.num_epochs)
    bar = progress_bar(len(train_iter) * len(epochs), progress)
    step = counted(step, bar)      # each step advances the bar
    with backends(switches), bar:
        for r in fit(step, train_iter, result, epochs, [device], dist.all_reduce):
            if rank == 0:  # rank 0 alone evaluates, saves and prints
                evaluate(r, net, (train_iter, test_iter), switches, on_epoch, readings)
    return result


def save_and_print(checkpoint, net, optimizer, r: TrainResult) -> None:
    """Rank 0's end of an epoch: the checkpoint (if asked for), then the epoch's line."""
    if checkpoint:
        save_checkpoint(checkpoint, net, optimizer, r)
    print(f"{LOG}epoch {len(r.train_loss)}/{r.config['num_epochs']}: loss "
          f"{r.train_loss[-1]:.3f}, train acc {r.train_acc[-1]:.3f}, test acc "
          f"{r.test_acc[-1]:.3f}, {r.epoch_seconds[-1]:.2f} s", flush=True)


def describe_job(device) -> str:
    world, backend = dist.get_world_size(), dist.get_backend()
    return (f"DDP, {world} {backend} process{'es' if world > 1 else ''}, each on "
            f"{describe_devices([device])}")


@record     # an exception goes to this rank's error file (TORCHELASTIC_ERROR_FILE)
def main(config: TrainConfig, out: Optional[str] = None,
         checkpoint: Optional[str] = None,
         resume: bool = False, backend: str = "auto",
         timeout_s: float = COLLECTIVE_TIMEOUT_S) -> None:
    """One rank of a torchrun job: train `config` (the global batch split over the
    ranks); rank 0 saves the result as JSON to `out`, then prints its summary. Bad
    input (missing data, a bad checkpoint, an uneven batch) is a `RankInputError`."""
    try:
        # refused before the rendezvous: an uneven batch
        local_batch_size(config.batch_size, int(os.environ["WORLD_SIZE"]))
        if checkpoint and not resume:
            check_fresh(checkpoint)
        exit_with_parent()
        result = train(config, setup(backend, timeout_s), checkpoint=checkpoint,
                       resume=bool(checkpoint and resume))
    except (ValueError, DataError, DeviceError) as e:
        raise RankInputError(str(e)) from e
    if dist.get_rank() == 0:
        if out:          # saved first: the job may be stopped once it exists
            write_atomic(out, json.dumps(result.to_dict()))
        print(LOG + result.summary(), flush=True)
    # No `finally`: after an exception the process exits, and destroying the group
    # first could wait on a peer, delaying the error file that names the failed rank.
    dist.destroy_process_group()


def on_off(text: str, words: bool = False):
    """A switch's value on a command line: on/off, true/false, yes/no, 1/0; with `words`, any
    other word as itself ('auto', 'graphs'), for `TrainConfig` to accept or refuse."""
    t = text.strip().lower()
    if t in ("true", "on", "yes", "1", "false", "off", "no", "0"):
        return t in ("true", "on", "yes", "1")
    if words and t.isalpha():
        return t
    raise argparse.ArgumentTypeError(f"must be on or off, got {text!r}")


# A setting's type (as `TrainConfig` declares it) -> how a command line reads its value; the
# ranges are TrainConfig's own to check (`__post_init__`).
READ = {"int": int, "Optional[int]": int, "float": float, "str": str, "bool": on_off,
        "Union[bool, str]": lambda text: on_off(text, words=True)}


def flag_name(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def kind(f: dataclasses.Field) -> str:
    """A field's declared type as `READ` names it ('int', 'Optional[int]', ...)."""
    return f.type if isinstance(f.type, str) else f.type.__name__


def add_flags(parser, cls=TrainConfig, skip=()) -> None:
    """A flag for each setting of `cls` with a command line (its help from the field; an
    on/off switch given alone means on)."""
    for f in dataclasses.fields(cls):
        if f.metadata.get("cli", True) and f.name not in skip:
            alone = kind(f) == "bool"
            parser.add_argument(flag_name(f), dest=f.name, type=READ[kind(f)],
                                nargs="?" if alone else None, const=True if alone else None,
                                help=f.metadata.get("help"))


class Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line, exit 2 (argparse adds a usage line first);
    the CLI's and the tools' too."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_args(argv=None):
    """`main`'s arguments: a flag per `TrainConfig` setting over `--config` (JSON). Input is
    checked here, where it enters: a bad value, a bad `--config` or an `--out` that holds
    something other than an earlier result is one line and exit 2, before any rank trains."""
    parser = Parser(prog="torchrun --nproc_per_node=N -m mgpu_lib.ddp",
                     description=__doc__.splitlines()[0])
    add_flags(parser, TrainConfig, skip=("devices",))     # devices: --nproc_per_node
    parser.add_argument("--config", help="a TrainConfig as JSON; the flags override it")
    parser.add_argument("--out", help="rank 0 writes the result here (JSON)")
    parser.add_argument("--checkpoint", help="folder for a checkpoint after every epoch")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--backend", default="auto", choices=["auto", "nccl", "gloo"])
    parser.add_argument("--timeout", type=float, default=COLLECTIVE_TIMEOUT_S,
                        help="seconds a collective waits for a silent rank")
    args = parser.parse_args(argv)
    if "WORLD_SIZE" not in os.environ:
        parser.error("run this under torchrun, which sets RANK, WORLD_SIZE, MASTER_ADDR, ...")
    given = {k: v for k, v in vars(args).items()
             if k in TrainConfig.__dataclass_fields__ and v is not None}
    try:
        base = json.loads(Path(args.config).read_text(encoding="utf-8")) if args.config else {}
        config = TrainConfig(**{**base, **given})
        if args.out:
            check_out(args.out)
    except (OSError, ValueError, TypeError) as e:
        parser.error(str(e).splitlines()[0] if str(e) else type(e).__name__)
    return config, args.out, args.checkpoint, args.resume, args.backend, args.timeout


if __name__ == "__main__":
    main(*parse_args())
