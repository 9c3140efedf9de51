"""Command line: `python -m mgpu_lib train ...` (argparse lives only here).

    python -m mgpu_lib train --devices 1 --batch-size 256 --lr 0.1 --epochs 10 --out run.json
    python -m mgpu_lib train --profile smoke

Exit codes: 0 done; 2 bad input (one line on stderr); 3 the run diverged (result still written).
"""
from __future__ import annotations

import argparse
import math
import sys
from typing import Optional, Sequence


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


def build_parser() -> Parser:
    parser = Parser(prog="python -m mgpu_lib", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    add_train_args(sub.add_parser("train", help="train the chapter's ResNet-18"))
    return parser


def config_from_args(args):
    """A `TrainConfig` from the profile, overridden by every flag that was given."""
    from .profiles import active_profile, get_profile
    from .train import TrainConfig
    profile = get_profile(args.profile) if args.profile else active_profile()
    overrides = {k: v for k, v in dict(
        devices=args.devices, batch_size=args.batch_size, lr=args.lr, num_epochs=args.epochs,
        width=args.width, train_limit=args.train_limit, test_limit=args.test_limit).items()
        if v is not None}
    return TrainConfig.from_profile(profile, seed=args.seed, data_source=args.data_source,
                                    **overrides)


def cmd_train(args) -> int:
    from .train import train
    config = config_from_args(args)
    result = train(config, progress=True)
    if args.out:
        result.save(args.out)
    return 0 if result.status == "ok" else 3


def main(argv: Optional[Sequence[str]] = None) -> int:
    from .data import DataError
    from .devices import DeviceError
    args = build_parser().parse_args(argv)
    try:
        return {"train": cmd_train}[args.command](args)
    except (ValueError, DeviceError, DataError) as e:
        print(f"python -m mgpu_lib {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
