"""Command line: `python -m mgpu_lib train ...` (argparse lives only here).

    python -m mgpu_lib train --devices 1 --batch-size 256 --lr 0.1 --epochs 10 --out run.json
    python -m mgpu_lib train --profile smoke
    python -m mgpu_lib sweep --profile cpu --vary lr=0.05,0.2 --seeds 0,1,2 --store runs/x.jsonl
    python -m mgpu_lib bench --width 16 --out runs/bench.jsonl
    python -m mgpu_lib pages          # each page's predicted run time (the README's table)
    python -m mgpu_lib trace --nprocs 2 --profile smoke --bucket-cap-mb 1 --out runs/trace
    torchrun --nproc_per_node=2 -m mgpu_lib worker --profile smoke   # one DDP rank

Exit codes: 0 done; 1 a DDP rank failed; 2 bad input (one line on stderr); 3 the run diverged
(its result is still written).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from .bench import bench, format_bench
from .data import DataError
from .ddp import CKPT_NAME, COLLECTIVE_TIMEOUT_S, LaunchError, launch, run
from .devices import DeviceError, num_gpus
from .pages import prediction_header, prediction_rows
from .profiles import active_profile, get_profile
from .results import ResultsError, append, check_writable
from .supervise import LOG
from .sweep import sweep
from .switches import BF16_FLAG
from .trace import Variant, summary_lines, trace_ddp
from .train import TrainConfig, train


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


class Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line, with exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def add_train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--devices", type=positive_int, default=None,
                   help="number of GPUs (default: all; the CPU where there is none)")
    p.add_argument("--batch-size", type=positive_int, help="global batch size")
    p.add_argument("--lr", type=positive_float, help="learning rate")
    p.add_argument("--epochs", type=positive_int, help="number of epochs")
    p.add_argument("--width", type=positive_int, help="ResNet width (64 = the chapter's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-limit", type=positive_int, help="class-balanced training subset")
    p.add_argument("--test-limit", type=positive_int, help="class-balanced test subset")
    p.add_argument("--data-source", default="auto",
                   choices=["auto", "local", "torchvision", "synthetic"])
    p.add_argument("--profile", help="smoke, cpu or full (default: MGPU_PROFILE, else by hardware)")
    p.add_argument("--out", help="write the TrainResult JSON here")


def add_strategy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--strategy", choices=["dp", "ddp"], default="dp",
                   help="dp: nn.DataParallel in one process (the chapter's); ddp: "
                        "DistributedDataParallel, one process per device")
    p.add_argument("--nprocs", type=positive_int, help="DDP processes (default: GPUs, else 2)")
    p.add_argument("--checkpoint", help="DDP: folder for a checkpoint after every epoch")
    p.add_argument("--resume", action="store_true", help="DDP: continue from --checkpoint")
    p.add_argument("--timeout", type=positive_float, default=COLLECTIVE_TIMEOUT_S,
                   help="DDP: seconds a rank waits for a silent peer before the job fails "
                        f"(default {COLLECTIVE_TIMEOUT_S:g})")


def build_parser() -> Parser:
    parser = Parser(prog="python -m mgpu_lib", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    train_parser = sub.add_parser("train", help="train the chapter's ResNet-18")
    add_train_args(train_parser)
    add_strategy_args(train_parser)
    add_sweep_args(sub.add_parser("sweep", help="resumable hyperparameter sweep into a JSON store"))
    add_bench_args(sub.add_parser("bench", help="the chapter's loop vs the fast loop, alternating"))
    add_worker_args(sub.add_parser("worker", help="one DDP rank; run it under torchrun"))
    sub.add_parser("pages", help="each page's predicted run time (the README's table)")
    add_trace_args(sub.add_parser("trace", help="a few DDP steps under torch.profiler: "
                                                "per-rank traces, all-reduce overlap"))
    return parser


def config_from_args(args) -> TrainConfig:
    """A `TrainConfig` from the profile, overridden by every flag that was given."""
    profile = get_profile(args.profile) if args.profile else active_profile()
    overrides = {k: v for k, v in dict(
        devices=args.devices, batch_size=args.batch_size, lr=args.lr, num_epochs=args.epochs,
        width=args.width, train_limit=args.train_limit, test_limit=args.test_limit).items()
        if v is not None}
    return TrainConfig.from_profile(profile, seed=args.seed, data_source=args.data_source,
                                    **overrides)


def cmd_train(args) -> int:
    config = config_from_args(args)
    if args.out:
        check_writable(args.out)               # before training, not after
    if args.strategy == "ddp":
        result = _train_ddp(config, args)      # it echoes rank 0's summary line itself
        if result is None:
            return 1
    elif args.nprocs or args.checkpoint or args.resume:
        raise ValueError("--nprocs, --checkpoint and --resume need --strategy ddp")
    else:
        result = train(config, progress=True)
        print(result.summary())
    if args.out:
        result.save(args.out)
    return 0 if result.status == "ok" else 3


def vary_arg(text: str) -> tuple:
    """`lr=0.05,0.1` -> ("lr", [0.05, 0.1]); ints for counts, floats for lr and warmup."""
    name, sep, values = text.partition("=")
    name = {"epochs": "num_epochs"}.get(name.replace("-", "_"), name.replace("-", "_"))
    if not sep or not values:
        raise argparse.ArgumentTypeError(f"expected NAME=V1,V2,..., got {text!r}")
    convert = {"lr": positive_float, "warmup_epochs": nonnegative_float,
               "nprocs": int}.get(name, positive_int)
    try:
        parsed = [convert(v) for v in values.split(",")]
    except (ValueError, argparse.ArgumentTypeError) as e:
        raise argparse.ArgumentTypeError(f"bad value in {text!r}: {e}") from None
    if any(v < 0 for v in parsed):
        raise argparse.ArgumentTypeError(f"values must not be negative, got {text!r}")
    return name, parsed


def add_sweep_args(p: argparse.ArgumentParser) -> None:
    add_train_args(p)
    p.add_argument("--vary", type=vary_arg, action="append", required=True,
                   help="NAME=V1,V2,... (repeatable): batch_size, lr, num_epochs, devices, "
                        "warmup_epochs, nprocs (DDP processes; 0 = DataParallel)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--store", required=True,
                   help="JSON Lines store: read, then one record appended per new point")


def cmd_sweep(args) -> int:
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        raise ValueError(f"--seeds must be comma-separated integers, got {args.seeds!r}") from None
    records = sweep(config_from_args(args), dict(args.vary), seeds=seeds, store=args.store,
                    log=print)
    print(f"{len(records)} points in {args.store}")
    return 0


def add_bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=positive_int, default=5, help="timed steps per repeat")
    p.add_argument("--batch-size", type=positive_int, default=256)
    p.add_argument("--width", type=positive_int, default=64, help="ResNet width (64 = chapter)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: the first GPU, else the CPU)")
    p.add_argument("--repeats", type=positive_int, default=3, help="alternating rounds")
    p.add_argument("--warmup-steps", type=positive_int, default=2)
    p.add_argument("--workers", type=int, help="reference DataLoader workers (default: 4, "
                                               "capped at the usable cores)")
    p.add_argument("--bf16", choices=["auto", "on", "off"], default="auto",
                   help="the fast loop's bf16 autocast (auto: on GPUs with bf16; CPUs: off)")
    p.add_argument("--norm-fp32", action="store_true",
                   help="with --bf16 on: keep BatchNorm (and what follows it) in fp32")
    p.add_argument("--out", help="append the result as one line to this JSON Lines file")


def cmd_bench(args) -> int:
    if args.out:
        check_writable(args.out)
    result = bench(width=args.width, batch_size=args.batch_size, steps=args.steps,
                   repeats=args.repeats, warmup_steps=args.warmup_steps, device=args.device,
                   num_workers=args.workers,
                   bf16=BF16_FLAG[args.bf16],
                   norm_fp32=args.norm_fp32)
    print("\n".join(format_bench(result)))
    if args.out:
        append(args.out, result)
    return 0


def _train_ddp(config, args):
    if args.devices is not None:
        raise ValueError("with --strategy ddp, --nprocs sets the number of processes, "
                         "not --devices")
    if args.resume and not args.checkpoint:
        raise ValueError("--resume needs --checkpoint DIR")
    try:      # launch echoes rank 0's progress and summary lines
        return launch(config, args.nprocs or num_gpus() or 2, checkpoint=args.checkpoint,
                      resume=args.resume, collective_timeout_s=args.timeout,
                      log=lambda line: print(line, flush=True))
    except LaunchError as e:    # a failed rank: one line, exit code 1
        print(f"python -m mgpu_lib train: error: {e}", file=sys.stderr)
        return None


def add_worker_args(p: argparse.ArgumentParser) -> None:
    add_train_args(p)
    p.add_argument("--checkpoint", help="folder for a checkpoint after every epoch")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint")
    p.add_argument("--backend", default="auto", choices=["auto", "nccl", "gloo"])
    p.add_argument("--timeout", type=positive_float, default=COLLECTIVE_TIMEOUT_S,
                   help="seconds a collective may wait for a silent rank")
    p.add_argument("--threads", type=positive_int,
                   help="CPU threads per process (default: its share of this node's cores)")
    p.add_argument("--config", help=argparse.SUPPRESS)   # `launch` passes its exact config


def cmd_worker(args) -> int:
    """One rank of a torchrun job. A run that diverged exits 0 too: its result says so."""
    if "RANK" not in os.environ:
        raise ValueError("run this under torchrun: torchrun --nproc_per_node=N -m mgpu_lib "
                         "worker ...")
    if args.devices is not None:
        raise ValueError("--devices does not apply: torchrun's --nproc_per_node sets the "
                         "processes")
    try:
        config = (TrainConfig(**json.loads(Path(args.config).read_text())) if args.config
                  else config_from_args(args))
        if args.out:
            check_writable(args.out)
        if args.checkpoint:       # a folder we cannot write: now, not after the first epoch
            check_writable(Path(args.checkpoint) / CKPT_NAME)
        run(config, backend=args.backend, checkpoint=args.checkpoint, resume=args.resume,
            out=args.out, timeout_s=args.timeout, threads=args.threads,
            log=lambda line: print(LOG + line, flush=True))
    except (ValueError, DataError, DeviceError) as e:     # CheckpointError is a ValueError
        print(f"mgpu_lib worker rank {os.environ['RANK']}: error: {e}", file=sys.stderr,
              flush=True)
        return 2
    return 0


def cmd_pages(args) -> int:
    """The README's table: each page's predicted time on a Colab T4 and on a 2-core CPU."""
    try:
        header, rows = prediction_header(), prediction_rows()
    except ValueError as e:                      # MGPU_PAGE_BUDGET_MIN that is not a number
        print(f"mgpu_lib pages: error: {e}", file=sys.stderr)
        return 2
    for line in header + ["| " + " | ".join(map(str, row)) + " |" for row in rows]:
        print(line)
    return 0


def add_trace_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nprocs", type=positive_int, default=2,
                   help="DDP processes (default 2)")
    p.add_argument("--profile", help="smoke, cpu or full: the width and global batch "
                                     "(default: MGPU_PROFILE, else by hardware)")
    p.add_argument("--bucket-cap-mb", type=positive_float,
                   help="trace this bucket cap only (default: small buckets, one bucket, and "
                        "one bucket with no_sync)")
    p.add_argument("--accumulate", type=positive_int, default=1,
                   help="with --bucket-cap-mb: micro-batches per step, all but the last under "
                        "no_sync")
    p.add_argument("--steps", type=positive_int, default=2,
                   help="steps recorded, after two unrecorded ones (default 2)")
    p.add_argument("--out", default="runs/trace",
                   help="folder for the per-rank Chrome traces and events.json")
    p.add_argument("--timeout", type=positive_float, default=300.0,
                   help="stop every process after this many seconds (default 300)")


def cmd_trace(args) -> int:
    """Trace DDP steps; print what the traces measured and where they are."""
    config = TrainConfig.from_profile(get_profile(args.profile) if args.profile
                                      else active_profile())
    if args.accumulate > 1 and args.bucket_cap_mb is None:
        raise ValueError("--accumulate needs --bucket-cap-mb")
    variants = None
    if args.bucket_cap_mb is not None:
        name = f"bucket cap {args.bucket_cap_mb:g} MB" + (
            f", no_sync x{args.accumulate}" if args.accumulate > 1 else "")
        variants = [Variant(name, args.bucket_cap_mb, args.accumulate)]
    check_writable(Path(args.out) / "events.json")
    try:
        run = trace_ddp(config, args.nprocs, variants, out=args.out, active=args.steps,
                        timeout_s=args.timeout)
    except (RuntimeError, TimeoutError) as e:     # a rank failed or hung: one line
        print(f"python -m mgpu_lib trace: error: {e}", file=sys.stderr)
        return 1
    print("\n".join(summary_lines(run)))
    print(f"traces: {args.out}/*/rank*.json; open one in https://ui.perfetto.dev")
    return 0


COMMANDS = {"train": cmd_train, "sweep": cmd_sweep, "bench": cmd_bench, "worker": cmd_worker,
            "pages": cmd_pages, "trace": cmd_trace}


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (ValueError, DeviceError, DataError, ResultsError) as e:
        print(f"python -m mgpu_lib {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
