"""Does the fast loop learn as well as the chapter's? Both loops over many seeds, paired by seed.

    python tools/record_accuracy.py --profile cpu --bf16 off --seeds 0-19

The study is a sweep over `fast` (the chapter's loop, then the fast loop) x seeds, stored with
`sweep.py` (`recorded/accuracy_cpu.jsonl`); the chapter's loop is stored once per seed and pairs
with every fast variant of that seed. Seeds alone move this model's final accuracy by a few
points, so each gap is a mean over seeds with its standard error.
"""
from __future__ import annotations

from typing import Sequence

from .store import mean_std_se
from ..config import Switches
from ..training import record_header as header, TrainConfig, train


def compare_accuracy(config: TrainConfig, data_fast=None, data_reference=None) -> dict:
    """Train `config` on the chapter's loop and on the fast loop; both results and the gap."""
    reference = train(config.replace(fast=False), data=data_reference, progress=False)
    fast = train(config.replace(fast=True), data=data_fast, progress=False)
    return {**header(hardware=fast.hardware, profile=config.profile, config=config.to_dict()),
            "data_source": fast.data_source, "reference": reference.to_dict(),
            "fast": fast.to_dict(),
            "gap_points": 100 * (fast.final_test_acc - reference.final_test_acc)}


def pairs(records: Sequence) -> dict:
    """Sweep records of both loops -> {fast switches' description: [pair, ...]}, where a pair is
    {"seed", "profile", "hardware", "reference": metrics, "fast": metrics} for one seed."""
    references = {(r.profile, r.seed): r for r in records if not r.config["fast"]}
    groups: dict = {}
    for r in records:
        ref = references.get((r.profile, r.seed))
        if not r.config["fast"] or ref is None or r.status != "ok":
            continue
        describe = Switches(**r.extra["switches"]).describe()
        groups.setdefault(describe, []).append(
            {"seed": r.seed, "profile": r.profile, "hardware": r.hardware,
             "bf16": r.extra["switches"]["bf16"], "reference": ref.metrics, "fast": r.metrics})
    return groups


def summarize_accuracy(records: Sequence) -> list[dict]:
    """One dict per fast variant: mean accuracies and the paired gaps with standard errors.

    Each seed's final-epoch gap (fast - reference, in points) is one sample. The training
    accuracy of the last epoch, averaged over all its steps, is the less noisy second view.
    """
    out = []
    for describe, group in pairs(records).items():
        gaps = [100 * (p["fast"]["test_acc"][-1] - p["reference"]["test_acc"][-1])
                for p in group]
        train_gaps = [100 * (p["fast"]["train_acc"][-1] - p["reference"]["train_acc"][-1])
                      for p in group]
        gap, _, gap_se = mean_std_se(gaps)
        train_gap, _, train_gap_se = mean_std_se(train_gaps)
        out.append({"fast": describe, "seeds": len(group), "records": group,
                    "bf16": group[0]["bf16"], "profile": group[0]["profile"],
                    "hardware": group[0]["hardware"],
                    "reference_mean": mean_std_se([p["reference"]["test_acc"][-1]
                                                   for p in group])[0],
                    "fast_mean": mean_std_se([p["fast"]["test_acc"][-1] for p in group])[0],
                    "gap_mean_points": gap, "gap_se_points": gap_se, "gaps_points": gaps,
                    "train_gap_mean_points": train_gap, "train_gap_se_points": train_gap_se})
    return out


def paired_fast_gap(pairs_a: Sequence[dict], pairs_b: Sequence[dict],
                    metric: str = "test_acc") -> dict:
    """Fast run of `pairs_b` minus fast run of `pairs_a`, seed by seed (final epoch, points):
    mean, standard error and the number of seeds both hold."""
    a = {p["seed"]: p["fast"][metric][-1] for p in pairs_a}
    diffs = [100 * (p["fast"][metric][-1] - a[p["seed"]]) for p in pairs_b if p["seed"] in a]
    mean, _, se = mean_std_se(diffs)
    return {"seeds": len(diffs), "mean_points": mean, "se_points": se}

