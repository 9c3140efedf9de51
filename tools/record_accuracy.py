"""Record the fast loop's accuracy against the chapter's loop over many seeds.

    MGPU_FASHION_MNIST_DIR=... .venv/bin/python tools/record_accuracy.py --profile cpu \
        --bf16 off --seeds 0-19 --yes

A sweep over `fast` (the chapter's loop, then the fast loop) x seeds into
`mgpu_lib/recorded/accuracy_<profile>.jsonl`. The chapter's loop ignores the fast path's switches,
so its run of a seed is stored once and reused by every fast variant (`--bf16`, `--norm-fp32`).
Points already stored are skipped, so an interrupted run continues where it stopped.
"""
from __future__ import annotations

import sys
from pathlib import Path

from mgpu_lib.book.cli import BF16_FLAG, SWEEP_CAP, Parser, check_plan, seed_list
from mgpu_lib.book.profiles import PROFILES, get_profile
from mgpu_lib.book.sweep import sweep, unique

# The repository's copy of the records (this tool makes package data, in a clone), never an
# installed package's.
RECORDED = Path(__file__).resolve().parent.parent / "mgpu_lib" / "recorded"


def main(argv=None) -> int:
    p = Parser(prog="tools/record_accuracy.py", description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="cpu", choices=list(PROFILES))
    p.add_argument("--bf16", choices=list(BF16_FLAG), default="auto",
                   help="the fast loop's bf16 switch (auto: native bf16 on GPUs only)")
    p.add_argument("--norm-fp32", action="store_true",
                   help="under bf16, run BatchNorm (and what follows it) in fp32")
    p.add_argument("--seeds", type=seed_list, default=[0, 1, 2], help="e.g. 0-19")
    p.add_argument("--yes", action="store_true",
                   help=f"train a plan of more than {SWEEP_CAP} points or of hours")
    p.add_argument("--store", help="JSON Lines store (default: the repository's "
                                   "mgpu_lib/recorded/accuracy_<profile>.jsonl)")
    args = p.parse_args(argv)
    if args.norm_fp32 and BF16_FLAG[args.bf16] is not True:
        p.error("--norm-fp32 applies to bf16: add --bf16 on")
    base = get_profile(args.profile).config(bf16=BF16_FLAG[args.bf16],
                                            norm_fp32=args.norm_fp32)
    store = args.store or RECORDED / f"accuracy_{args.profile}.jsonl"
    vary, seeds = {"fast": [False, True]}, unique(args.seeds)
    try:
        check_plan(base, vary, seeds, args.yes)     # printed; too big without --yes: refused
        sweep(base, vary, seeds=seeds, store=store,
              log=lambda line: print(line, flush=True))
    except ValueError as e:          # a store that is no store, a device that is not here
        p.exit(2, f"{p.prog}: error: {e}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
