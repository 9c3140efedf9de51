"""Command line: `python -m mgpu_lib train ...` (argparse lives only here).

    python -m mgpu_lib train --devices 1 --batch-size 256 --lr 0.1 --epochs 10 --out run.json
    python -m mgpu_lib train --profile smoke
    python -m mgpu_lib sweep --profile cpu --vary lr=0.05,0.2 --seeds 0,1,2 --store runs/x.jsonl
    python -m mgpu_lib bench --width 16 --out runs/bench.jsonl
    python -m mgpu_lib pages          # each page's predicted run time (the README's table)
    python -m mgpu_lib trace --nprocs 2 --profile smoke --bucket-cap-mb 1 --out runs/trace
    torchrun --standalone --nproc_per_node=2 -m mgpu_lib.ddp --epochs 1   # DDP itself

Exit codes: 0 done; 1 a DDP rank failed; 2 bad input (one line on stderr); 3 the run diverged
(its result is still written); 130 Ctrl-C and 143 SIGTERM. Output paths are checked before any
work, and a result is saved before anything is printed about it; once standard output's reader
is gone (`| head`), printing is dropped and the work goes on.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from contextlib import contextmanager, redirect_stdout, suppress
from pathlib import Path
from typing import Optional, Sequence

from ..lab.bench import bench, check_fits, format_bench
from ..lab.d2l import chapter_data
from ..data import DataError
from ..ddp import CKPT_NAME, COLLECTIVE_TIMEOUT_S, Parser, add_flags, check_fresh
from ..devices import DeviceError, num_gpus, try_gpu
from .pages import minutes, prediction_table, span
from .profiles import active_profile, get_profile
from .store import append, check_output, check_writable, plural, save_result
from ..config import AUTO, channels_last_safe, is_number
from .flags import COUNT, POSITIVE_INT, POSITIVE_NUMBER, Check, argtype, on_cli
from ..lab.launcher import LaunchError, launch
from .sweep import (count_points, merge_vary, parse_seeds, parse_vary, predicted_sweep, sweep,
                    unique, vary_keys)
from ..lab.trace import ONE_BUCKET_MB, Variant, summary_lines, trace_ddp
from ..training import TrainConfig, train

TIMEOUT = POSITIVE_NUMBER       # seconds: --timeout here and in tools/execute_notebook.py
# A cap above the model's gradients is one bucket, so larger caps change nothing; DDP turns the
# cap into a byte count, which overflows near 1e300.
BUCKET_CAP = Check(f"a number of MiB above 0 and at most {ONE_BUCKET_MB:g} (one bucket for "
                   f"any model here)", lambda v: is_number(v) and 0 < v <= ONE_BUCKET_MB, float)
BF16_FLAG = {"auto": AUTO, "on": True, "off": False}    # a --bf16 value as a config value
seed_list = argtype(parse_seeds)      # --seeds of `sweep` and of the tools


def build_parser(config=TrainConfig) -> Parser:
    """The command line; every `config.setting` field is a flag of train and sweep."""
    parser = Parser(prog="python -m mgpu_lib", description=__doc__.splitlines()[0])
    parser.set_defaults(config_class=config)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    def command(name: str, text: str, trains: bool = False) -> argparse.ArgumentParser:
        """A subcommand; one that `trains` has a flag per setting of `config` (left out: the
        profile's value) and --profile."""
        p = sub.add_parser(name, help=text)
        if trains:
            add_flags(p, config)
            p.add_argument("--profile",
                           help="smoke, cpu or full (default: MGPU_PROFILE, else by hardware)")
        return p

    p = command("train", "train the chapter's ResNet-18", trains=True)
    p.add_argument("--out", help="write the TrainResult JSON here")
    p.add_argument("--strategy", choices=["dp", "ddp"], default="dp",
                   help="dp: nn.DataParallel in one process (the chapter's); ddp: "
                        "DistributedDataParallel, one process per device")
    p.add_argument("--nprocs", type=POSITIVE_INT, help="DDP processes (default: GPUs, else 2)")
    p.add_argument("--checkpoint", help="DDP: folder for a checkpoint after every epoch")
    p.add_argument("--resume", action="store_true", help="DDP: continue from --checkpoint")
    p.add_argument("--timeout", type=TIMEOUT,
                   help="DDP: seconds a rank waits for a silent peer before the job fails "
                        f"(default {COLLECTIVE_TIMEOUT_S:g})")

    p = command("sweep", "resumable hyperparameter sweep into a JSON store", trains=True)
    p.add_argument("--vary", type=argtype(lambda text: parse_vary(text, config)),
                   action="append", required=True,
                   help="NAME=V1,V2,... (repeatable; a repeated name adds its values): "
                        f"{', '.join(vary_keys(config))} (nprocs: DDP processes, 0 = "
                        "DataParallel)")
    p.add_argument("--seeds", type=seed_list, default=[0, 1, 2],
                   help="seeds and ranges, e.g. 0-4,7 (default 0,1,2)")
    p.add_argument("--store", required=True,
                   help="JSON Lines store: read, then one record appended per new point")
    p.add_argument("--yes", action="store_true",
                   help=f"train a sweep of more than {SWEEP_CAP} points or predicted to take "
                        f"more than {SWEEP_HOURS:g} h (it is refused otherwise)")

    p = command("bench", "the chapter's loop vs the fast loop, alternating")
    p.add_argument("--steps", type=POSITIVE_INT, default=5, help="timed steps per repeat")
    p.add_argument("--batch-size", type=POSITIVE_INT, default=256)
    p.add_argument("--width", type=POSITIVE_INT, default=64, help="ResNet width (64 = chapter)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: the first GPU, else the CPU)")
    p.add_argument("--repeats", type=POSITIVE_INT, default=3, help="alternating rounds")
    p.add_argument("--warmup-steps", type=POSITIVE_INT, default=2)
    p.add_argument("--workers", type=COUNT,
                   help="reference DataLoader workers (default: 4, capped at the usable cores)")
    p.add_argument("--bf16", choices=["auto", "on", "off"], default="auto",
                   help="the fast loop's bf16 autocast (auto: on GPUs with bf16; CPUs: off)")
    p.add_argument("--norm-fp32", action="store_true",
                   help="with --bf16 on: keep BatchNorm (and what follows it) in fp32")
    p.add_argument("--out", help="append the result as one line to this JSON Lines file")

    command("pages", "each page's predicted run time (the README's table)")

    p = command("trace", "a few DDP steps under torch.profiler: per-rank traces, all-reduce "
                         "overlap")
    p.add_argument("--nprocs", type=POSITIVE_INT, default=2, help="DDP processes (default 2)")
    p.add_argument("--profile", help="smoke, cpu or full: the width and global batch "
                                     "(default: MGPU_PROFILE, else by hardware)")
    p.add_argument("--bucket-cap-mb", type=BUCKET_CAP,
                   help="trace this bucket cap only (default: small buckets, one bucket, and "
                        "one bucket with no_sync)")
    p.add_argument("--accumulate", type=POSITIVE_INT, default=1,
                   help="with --bucket-cap-mb: micro-batches per step, all but the last under "
                        "no_sync")
    p.add_argument("--steps", type=POSITIVE_INT, default=2,
                   help="steps recorded, after two unrecorded ones (default 2)")
    p.add_argument("--out", default="runs/trace",
                   help="folder for the per-rank Chrome traces and events.json")
    p.add_argument("--timeout", type=TIMEOUT, default=300.0,
                   help="stop every process after this many seconds (default 300)")
    return parser


def config_from_args(args) -> TrainConfig:
    """The config (`args.config_class`): the profile's, then every flag given."""
    profile = get_profile(args.profile) if args.profile else active_profile()
    overrides = {f.name: getattr(args, f.name) for f in on_cli(args.config_class)
                 if getattr(args, f.name) is not None}
    config = profile.config(args.config_class, **overrides)
    check_fits(config.width, config.batch_size, config.devices)   # one line, before allocating
    if config.channels_last is True and not channels_last_safe(try_gpu().type, config.width):
        raise ValueError(f"--channels-last on crashes oneDNN on a CPU below width 16 (here "
                         f"{config.width}; torch 2.14): leave it auto or off")
    return config


def cmd_train(args) -> int:
    config = config_from_args(args)
    ddp = args.strategy == "ddp"
    if not ddp and (args.nprocs or args.checkpoint or args.resume or args.timeout is not None):
        raise ValueError("--nprocs, --checkpoint, --resume and --timeout need --strategy ddp")
    out = check_output(args.out) if args.out else None     # before training: never a store
    result = _train_ddp(config, args) if ddp else train(
        config, data=None if config.fast else chapter_data(config), progress=True)
    if out is not None:                        # saved first: printing can fail (a closed pipe)
        save_result(result, out)
    if not ddp:                                # DDP echoed rank 0's summary line already
        print(result.summary())
    return 0 if result.status == "ok" else 3


# A sweep this large prints its plan and needs --yes: 200 runs of the cpu profile take hours,
# and so can 2 runs of the full profile on a CPU.
SWEEP_CAP = 200
SWEEP_HOURS = 2.0


def check_plan(base: TrainConfig, vary: dict, seeds: Sequence[int], yes: bool) -> None:
    """Print a sweep's plan; unless `yes`, a ValueError if it has more than `SWEEP_CAP` points
    or takes more than `SWEEP_HOURS` hours."""
    n, pred = count_points(vary, seeds), predicted_sweep(base, vary, seeds)
    factors = " x ".join(f"{k} {len(unique(v))}" for k, v in vary.items())
    when = "no time prediction here" if pred is None else (
        f"predicted {span(*pred[:2])} on {pred[2]}, at most (stored points are skipped)")
    print(f"plan: {plural(n, 'point')} ({factors} x seeds {len(unique(seeds))}); {when}",
          flush=True)
    if n > SWEEP_CAP and not yes:
        raise ValueError(f"{n:,} points is more than {SWEEP_CAP}; pass --yes to train them all")
    if pred and pred[1] > SWEEP_HOURS * 3600 and not yes:
        raise ValueError(f"the plan may take {minutes(pred[1])}, more than {SWEEP_HOURS:g} h; "
                         f"pass --yes to train it")


def cmd_sweep(args) -> int:
    seeds, base, vary = unique(args.seeds), config_from_args(args), merge_vary(args.vary)
    check_plan(base, vary, seeds, args.yes)
    records = sweep(base, vary, seeds=seeds, store=args.store,
                    log=lambda line: print(line, flush=True))
    print(f"{plural(len(records), 'point')} in {args.store}")
    return 0


def cmd_bench(args) -> int:
    if args.out:     # it appends: a store of benchmarks, refused before the run
        check_writable(args.out, store=True, kind="bench")
    result = bench(width=args.width, batch_size=args.batch_size, steps=args.steps,
                   repeats=args.repeats, warmup_steps=args.warmup_steps, device=args.device,
                   num_workers=args.workers, bf16=BF16_FLAG[args.bf16], norm_fp32=args.norm_fp32)
    if args.out:                  # saved first: printing can fail (a closed pipe, a full disk)
        append(args.out, result)
    print("\n".join(format_bench(result)))
    return 0


def _train_ddp(config, args):
    if args.devices is not None:
        raise ValueError("with --strategy ddp, --nprocs sets the number of processes, "
                         "not --devices")
    if args.resume and not args.checkpoint:
        raise ValueError("--resume needs --checkpoint DIR")
    if args.checkpoint:          # a folder we cannot write: now, not after the first epoch
        check_writable(Path(args.checkpoint) / CKPT_NAME)
    if not args.resume:          # an earlier run's snapshot is never replaced
        check_fresh(args.checkpoint)
    # launch echoes rank 0's progress and summary lines; a failed rank is a LaunchError
    return launch(config, args.nprocs or num_gpus() or 2, checkpoint=args.checkpoint,
                  resume=args.resume, collective_timeout_s=args.timeout or COLLECTIVE_TIMEOUT_S,
                  log=lambda line: print(line, flush=True))


def cmd_pages(args) -> int:
    print("\n".join(prediction_table()))
    return 0


def check_trace_folder(out) -> None:
    """`trace --out` writes into a new or empty folder, or one that holds this command's own
    earlier traces (an `events.json` of a trace run, the variants' rank*.json), never another
    folder's files (issue 52: it had replaced a user's events.json without a word)."""
    files, ours = [f for f in Path(out).rglob("*") if f.is_file()], False
    with suppress(OSError, ValueError):         # no events.json, or not one of a trace run
        ours = not files or {"hardware", "nprocs", "ranks"} <= set(
            json.loads((Path(out) / "events.json").read_text(encoding="utf-8")))
    if not ours or any(f.name != "events.json" and not (f.parent.parent == Path(out) and
                                                          f.match("rank*.json")) for f in files):
        raise ValueError(f"--out {out} holds files that are not this command's traces; name a "
                         f"new folder (or one with earlier traces alone)")


def cmd_trace(args) -> int:
    config = (get_profile(args.profile) if args.profile else active_profile()).config()
    if args.accumulate > 1 and args.bucket_cap_mb is None:
        raise ValueError("--accumulate needs --bucket-cap-mb")
    variants = None
    if args.bucket_cap_mb is not None:
        name = f"bucket cap {args.bucket_cap_mb:g} MiB" + (
            f", no_sync x{args.accumulate}" if args.accumulate > 1 else "")
        variants = [Variant(name, args.bucket_cap_mb, args.accumulate)]
    check_trace_folder(args.out)
    check_writable(Path(args.out) / "events.json")
    run = trace_ddp(config, args.nprocs, variants, out=args.out, active=args.steps,
                    timeout_s=args.timeout)
    print("\n".join(summary_lines(run)))
    print(f"traces: {args.out}/*/rank*.json; open one in https://ui.perfetto.dev")
    return 0


COMMANDS = {"train": cmd_train, "sweep": cmd_sweep, "bench": cmd_bench, "pages": cmd_pages,
            "trace": cmd_trace}


class _Stdout:
    """Standard output that outlives its reader (`| head -1`): once the pipe is closed, the
    descriptor points at os.devnull (Python's SIGPIPE recipe) and the work goes on."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def __getattr__(self, name: str):
        return getattr(self.stream, name)

    def write(self, text: str) -> int:
        self._unless_closed(self.stream.write, text)
        return len(text)

    def flush(self) -> None:
        self._unless_closed(self.stream.flush)

    def _unless_closed(self, method, *args) -> None:
        try:
            method(*args)
        except BrokenPipeError:
            with suppress(AttributeError, OSError, ValueError):     # a real file: at exit too
                os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())
            self.stream = open(os.devnull, "w", encoding="utf-8")


class Terminated(KeyboardInterrupt):
    """SIGTERM: stopped as Ctrl-C stops a command, said in one line; exit status 143."""
    exit_code = 143


@contextmanager
def sigterm_interrupts():
    """While inside, SIGTERM raises `Terminated` (a KeyboardInterrupt), so `finally` blocks run
    and the command says what it stopped."""
    def stop(signum, frame):
        raise Terminated("terminated (SIGTERM)")
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args, out = build_parser().parse_args(argv), _Stdout(sys.stdout)
    try:     # SIGTERM says what it stopped, as Ctrl-C does
        with redirect_stdout(out), sigterm_interrupts():
            try:
                return COMMANDS[args.command](args)
            finally:
                out.flush()     # a closed pipe is found now, not as Python exits
    except (ValueError, OSError, DeviceError, DataError, LaunchError) as e:
        print(f"python -m mgpu_lib {args.command}: error: {e}", file=sys.stderr)
        return 1 if isinstance(e, LaunchError) else 2     # a failed rank, else bad input
    except KeyboardInterrupt as e:     # Ctrl-C or SIGTERM
        print(f"python -m mgpu_lib {args.command}: {str(e) or 'interrupted (Ctrl-C)'}; "
              "stopped, no result written for the run in progress", file=sys.stderr)
        return getattr(e, "exit_code", 130)


if __name__ == "__main__":
    sys.exit(main())
