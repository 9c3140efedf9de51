"""Record the fast loop's accuracy against the chapter's loop, one JSON file per seed.

    MGPU_FASHION_MNIST_DIR=... .venv/bin/python tools/record_accuracy.py --profile cpu \
        --bf16 off --seeds 0-19 --reuse results/perf_accuracy_cpu_seed{seed}.json

Each file is `perf.compare_accuracy`'s record. `--reuse` names recorded files (with `{seed}`)
whose reference run is taken instead of trained again: the reference loop is deterministic on
one machine, and it is the slow half. Files already written are skipped, so an interrupted run
continues where it stopped.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mgpu_lib.perf import BF16_FLAG, compare_accuracy   # noqa: E402
from mgpu_lib.profiles import get_profile            # noqa: E402
from mgpu_lib.train import TrainConfig, TrainResult, write_json_atomic   # noqa: E402


def seed_list(text: str) -> list[int]:
    """'0-3,7' -> [0, 1, 2, 3, 7]."""
    seeds = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        seeds += list(range(int(lo), int(hi or lo) + 1))
    return seeds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="cpu")
    p.add_argument("--bf16", choices=list(BF16_FLAG), default="auto",
                   help="the fast loop's bf16 switch (auto: native bf16 only)")
    p.add_argument("--norm-fp32", action="store_true",
                   help="under bf16, run BatchNorm (and what follows it) in fp32")
    p.add_argument("--seeds", type=seed_list, default=[0, 1, 2])
    p.add_argument("--reuse", help="recorded files with '{seed}' whose reference to reuse")
    p.add_argument("--out", default=None,
                   help="output pattern with '{seed}' (default results/perf_accuracy_<profile>"
                        "[_fp32|_bf16]_seed{seed}.json)")
    args = p.parse_args(argv)
    bf16 = BF16_FLAG[args.bf16]
    tag = {"auto": "", "on": "_bf16", "off": "_fp32"}[args.bf16]
    if args.norm_fp32:
        if bf16 is not True:
            p.error("--norm-fp32 applies to bf16: add --bf16 on")
        tag += "_normfp32"
    out = args.out or str(ROOT / "results" / f"perf_accuracy_{args.profile}{tag}_seed{{seed}}.json")
    for seed in args.seeds:
        path = Path(out.format(seed=seed))
        if path.exists():
            print(f"seed {seed}: {path.name} exists, skipped", flush=True)
            continue
        config = TrainConfig.from_profile(get_profile(args.profile), seed=seed, bf16=bf16,
                                          norm_fp32=args.norm_fp32)
        reference = None
        if args.reuse:
            recorded = json.loads(Path(args.reuse.format(seed=seed)).read_text())
            reference = TrainResult.from_dict(recorded["reference"])
        t0 = time.perf_counter()
        rec = compare_accuracy(config, reference=reference)
        rec["seed"] = seed
        rec["reference_reused"] = reference is not None
        write_json_atomic(path, rec)
        print(f"seed {seed}: reference {rec['reference']['test_acc'][-1]:.4f}, fast "
              f"{rec['fast']['test_acc'][-1]:.4f}, gap {rec['gap_points']:+.2f} points "
              f"[{rec['fast']['extra']['switches']}] {time.perf_counter() - t0:.0f} s",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
