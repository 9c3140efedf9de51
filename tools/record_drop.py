"""Record the accuracy-drop experiment (mgpu_lib.lab.drop) on this machine, one seed at a time.

    python tools/record_drop.py --seeds 0,1,2 --out runs/drop_cpu.jsonl
    python tools/record_drop.py --width 64 --train-limit 0 --seeds 0-4   # the chapter's scale

Each run is appended to the store as it finishes, so an interrupted command keeps what it did
and a rerun skips the runs already stored. The book ships the CPU record as
mgpu_lib/recorded/drop_cpu.jsonl; tools/gpu_check.py runs the chapter's scale on a GPU.
"""
from __future__ import annotations

import sys

from mgpu_lib.book.cli import Parser, seed_list
from mgpu_lib.book.store import append, check_writable, read
from mgpu_lib.book.flags import COUNT, POSITIVE_INT, POSITIVE_NUMBER
from mgpu_lib.lab.bench import check_fits
from mgpu_lib.data import DataError
from mgpu_lib.devices import DeviceError
from mgpu_lib.lab.drop import CONDITIONS, EXTRA, KIND, run_seed


def main(argv=None) -> int:
    p = Parser(prog="tools/record_drop.py", description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=seed_list, default=[0, 1, 2], help="e.g. 0,1,2 or 0-4")
    p.add_argument("--width", type=POSITIVE_INT, default=16)
    p.add_argument("--batch-size", type=POSITIVE_INT, default=128,
                   help="the first run's batch; the second runs use twice it")
    p.add_argument("--lr", type=POSITIVE_NUMBER, default=0.1)
    p.add_argument("--epochs", type=POSITIVE_INT, default=10)
    p.add_argument("--train-limit", type=COUNT, default=10000, help="0: all 60,000")
    p.add_argument("--test-limit", type=COUNT, default=2000, help="0: all 10,000")
    p.add_argument("--out", default="runs/drop_cpu.jsonl")
    p.add_argument("--conditions", default=",".join(CONDITIONS),
                   help=f"which runs, from {', '.join(CONDITIONS + EXTRA)}")
    args = p.parse_args(argv)
    conditions = args.conditions.split(",")
    unknown = set(conditions) - set(CONDITIONS + EXTRA)
    if unknown:
        p.error(f"unknown condition(s) {', '.join(sorted(unknown))}")
    try:       # a store that is no store, a read-only --out, a network too wide: one line
        check_fits(args.width, 2 * args.batch_size)      # the second runs' batch
        record(args, conditions)
    except (ValueError, DataError, DeviceError) as e:     # ResultsError is a ValueError
        p.exit(2, f"{p.prog}: error: {e}\n")
    return 0


def record(args, conditions: list) -> None:
    """Each seed's runs not in the store yet, each appended as it finishes."""
    out = check_writable(args.out, store=True, kind=KIND)
    for seed in args.seeds:
        done = {r.get("condition") for r in read(out) if r["config"]["seed"] == seed}
        todo = [c for c in conditions if c not in done]
        if not todo:
            print(f"seed {seed}: stored already", flush=True)
            continue
        run_seed(seed, width=args.width, batch_size=args.batch_size, lr=args.lr,
                 num_epochs=args.epochs, train_limit=args.train_limit or None,
                 test_limit=args.test_limit or None, conditions=todo,
                 log=lambda line: print(line, flush=True), save=lambda rec: append(out, rec))


if __name__ == "__main__":
    sys.exit(main())
