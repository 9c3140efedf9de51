"""The verdict rule, branch by branch, on constructed data (mgpu_lib.book.verdict)."""
import math
from types import SimpleNamespace

import numpy as np
import pytest

from mgpu_lib.book.verdict import (APART, by_seed, compare, decide,
                                   false_call_rate, holm, paired, pairing_pays, power,
                                   t_critical, unpaired)

NAMES = ("A", "B")


def test_a_ahead_when_every_seed_agrees_and_the_mean_clears_t_times_se():
    v = paired({0: 0.80, 1: 0.82, 2: 0.81}, {0: 0.70, 1: 0.71, 2: 0.72}, NAMES, scale=100)
    assert v.words == "A ahead" and v.winner == "A"
    assert v.n == 3 and v.paired
    assert v.mean == pytest.approx(10.0)
    assert abs(v.mean) > t_critical(2) * v.se


def test_three_seeds_with_differences_1_0_1_2_and_0_1_cannot_be_told_apart():
    # issue 31: the old "2 standard errors" cut called A ahead here (0.77 > 2 x 0.34)
    v = paired({0: 1.0, 1: 1.2, 2: 0.1}, {0: 0.0, 1: 0.0, 2: 0.0}, NAMES)
    assert v.words == APART and v.winner is None
    assert abs(v.mean) > 2 * v.se
    assert abs(v.mean) <= t_critical(2) * v.se


def test_the_t_rule_calls_a_false_winner_one_time_in_twenty_at_any_seed_count():
    assert t_critical(1) == pytest.approx(12.706, abs=1e-3)
    assert t_critical(2) == pytest.approx(4.303, abs=1e-3)
    for n in (2, 3, 5, 20):
        assert false_call_rate(n, t_critical(n - 1)) == pytest.approx(0.05)
    assert false_call_rate(3, 2.0) == pytest.approx(0.18, abs=0.01)    # the old cut
    assert false_call_rate(2, 2.0) == pytest.approx(0.30, abs=0.01)


def test_b_ahead_is_the_mirror_image():
    v = paired({0: 0.70, 1: 0.71, 2: 0.72}, {0: 0.80, 1: 0.82, 2: 0.81}, NAMES, scale=100)
    assert v.words == "B ahead" and v.winner == "B"
    assert v.mean == pytest.approx(-10.0)


def test_the_issue_warmup_differences_cannot_be_told_apart():
    # issue 20 item 5: paired differences +0.11, +0.39, -0.10 (t about 1)
    v = paired({0: 0.11, 1: 0.39, 2: -0.10}, {0: 0.0, 1: 0.0, 2: 0.0}, NAMES)
    assert v.words == APART and v.winner is None
    assert "no effect" not in str(v) and "no difference" not in str(v)
    assert f"could call is {v.detectable:.2f}" in str(v)
    assert "called" in str(v) and "of the time" in str(v)


def test_the_boundary_t_times_se_exactly_is_not_enough():
    cut = t_critical(4)
    assert decide(cut, 1.0, NAMES, n=5) == APART
    assert decide(cut + 1e-4, 1.0, NAMES, n=5) == "A ahead"
    assert decide(-cut - 1e-4, 1.0, NAMES, n=5) == "B ahead"


def test_one_seed_never_decides_however_large_the_gap():
    v = paired({0: 0.9}, {0: 0.1}, NAMES)
    assert v.words == f"one seed: {APART}" and v.n == 1
    assert math.isnan(v.se)
    assert "no standard error" in str(v)


def test_no_shared_seed_says_so():
    assert paired({0: 0.9}, {1: 0.1}, NAMES).words == f"no seeds: {APART}"


def test_pairs_only_the_seeds_both_sides_hold():
    v = paired({0: 1.0, 1: 2.0, 2: 3.0}, {1: 1.0, 2: 2.0}, NAMES)
    assert v.n == 2 and v.mean == pytest.approx(1.0) and v.se == 0.0
    assert v.words == "A ahead"       # no spread at all: any t clears it


def test_pairing_removes_the_shared_seed_term():
    # each seed moves both sides alike: unpaired cannot tell, paired can
    a = {s: base + 0.01 for s, base in enumerate([0.60, 0.80, 0.70, 0.90])}
    b = {s: base for s, base in enumerate([0.60, 0.80, 0.70, 0.90])}
    b[3] += 0.001
    assert paired(a, b, NAMES).words == "A ahead"
    assert unpaired(list(a.values()), list(b.values()), NAMES).words == APART


def test_unpaired_uses_welch_standard_error_and_degrees_of_freedom():
    v = unpaired([1.0, 2.0, 3.0], [0.0, 0.0, 0.0, 0.0], NAMES)
    assert not v.paired and v.n == 3
    assert v.se == pytest.approx(math.sqrt(1.0 / 3))
    assert v.dof == pytest.approx(2.0)      # all the spread is A's: A's n - 1
    assert v.words == APART                 # 2.0 < 4.30 x 0.577
    assert unpaired([1.0, 2.0, 3.0, 2.0, 2.0], [0.0] * 4, NAMES).words == "A ahead"


def test_compare_pairs_by_design_never_by_a_pre_test_on_the_same_runs():
    """Issue 49: choosing paired or Welch from the runs it then judges named a false winner in
    about 1 of 4 of the comparisons it paired at 3 to 5 seeds. Pairing is the caller's design."""
    base = [0.60, 0.80, 0.70, 0.90, 0.65]
    a = {s: v + 0.01 for s, v in enumerate(base)}
    b = {s: v + 0.001 * (s % 2) for s, v in enumerate(base)}
    u = compare(a, b, NAMES)                     # correlated, but not paired by design
    assert not u.paired and u.r > 0.99 and u.words == APART
    assert u.dof > len(base) - 1 and f"r = {u.r:+.2f}" in str(u)
    v = compare(a, b, NAMES, pair=True)          # one network read two ways
    assert v.paired and v.words == "A ahead"
    assert not compare({0: 1.0, 1: 2.0}, {2: 0.0, 3: 0.5}, NAMES).paired
    assert not pairing_pays(0.3, 20) and pairing_pays(0.6, 20) and not pairing_pays(0.9, 2)


def test_the_plain_words_come_from_the_same_rule_as_the_full_statement():
    ahead = paired({0: 0.90, 1: 0.93, 2: 0.91}, {0: 0.78, 1: 0.80, 2: 0.79}, ("run 4", "run 3"),
                   scale=100, unit="points")
    assert ahead.winner == "run 4" and ahead.plain == "run 4 is clearly ahead, by about 12 points"
    apart = unpaired([0.1, 0.9, 0.5], [0.2, 0.8, 0.4], ("A", "B"))
    assert apart.winner is None and apart.plain == "these seeds cannot tell A and B apart"
    assert "one seed" in paired({0: 1.0}, {0: 0.0}, NAMES).plain
    assert "nan" not in paired({}, {0: 0.8, 1: 0.82}, NAMES).plain
    for v in (ahead, apart):                     # the lesson layer carries no apparatus
        assert not any(w in v.plain for w in ("±", "Holm", "r =", "could call", "seeds,"))


def test_a_true_gap_at_the_threshold_is_called_about_half_the_time():
    assert power(2) == pytest.approx(0.615, abs=0.005)          # 3 seeds
    assert power(4) == pytest.approx(0.557, abs=0.005)          # 5 seeds
    assert 0.5 < power(100) < power(4) < power(2)
    rng = np.random.default_rng(0)                              # a simulation agrees
    d = rng.standard_normal((40_000, 3)) + t_critical(2) / np.sqrt(3)
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / np.sqrt(3))
    assert np.mean(abs(t) > t_critical(2)) == pytest.approx(power(2), abs=0.01)
    v = paired({0: 0.11, 1: 0.39, 2: -0.10}, {0: 0.0, 1: 0.0, 2: 0.0}, NAMES)
    assert f"called {power(2):.0%} of the time" in str(v)


def test_from_three_to_five_seeds_the_threshold_halves():
    """Issue 36: "with the square root" was wrong; t falls from 4.30 to 2.78 as well."""
    at = {n: t_critical(n - 1) / np.sqrt(n) for n in (3, 5)}     # in standard deviations
    assert at[5] / at[3] == pytest.approx(0.5, abs=0.01)
    assert np.sqrt(3 / 5) == pytest.approx(0.77, abs=0.01)       # what the root would give


def test_holm_holds_a_family_of_verdicts_to_one_false_winner_in_twenty():
    strong = paired({0: 0.80, 1: 0.82, 2: 0.81}, {0: 0.70, 1: 0.71, 2: 0.72}, NAMES)
    weak = unpaired([2.1, 2.5, 1.9, 2.4, 2.0], [1.2, 1.9, 1.3, 2.0, 1.2], NAMES)
    assert weak.winner == "A" and 0.05 / 3 < weak.p < 0.05
    held = holm([weak, strong, weak, weak])     # weak passes 0.05 / 2, not 0.05 / 3
    assert [v.winner for v in held] == [None, "A", None, None]
    assert held[1].level == pytest.approx(1 - 0.05 / 4) and held[0].family == 4
    assert "Holm over 4 verdicts" in str(held[0]) and held[0].words == APART
    assert [v.winner for v in holm([weak, strong])] == ["A", "A"]
    assert held[0].detectable > weak.detectable                  # a stricter cut, stated
    assert [v.winner for v in holm([strong])] == ["A"]
    rng = np.random.default_rng(1)                               # no real gaps: rarely any
    false = sum(any(v.winner for v in holm([unpaired(rng.standard_normal(5),
                                                     rng.standard_normal(5), NAMES)
                                            for _ in range(5)])) for _ in range(600))
    assert false / 600 < 0.08


def test_nonsense_in_is_refused_not_judged():
    """Issue 39: a NaN mean, a negative standard error and one name twice each gave a verdict."""
    with pytest.raises(ValueError):
        decide(float("nan"), 1.0, NAMES, n=5)
    with pytest.raises(ValueError):
        decide(1.0, -1.0, NAMES, n=5)
    with pytest.raises(ValueError, match="two different names"):
        paired({0: 0.5, 1: 0.6}, {0: 0.4, 1: 0.5}, ("X", "X"))


def test_identical_seeds_claim_no_smallest_gap():
    same = {0: 0.8, 1: 0.7, 2: 0.9}
    v = paired(same, dict(same), NAMES)
    assert v.words == APART and np.isnan(v.detectable)
    assert "0.00 points" not in str(v) and "could call is" not in str(v)
    assert "size no gap" in str(v)


def test_lower_is_better_turns_the_faster_side_into_the_one_ahead():
    fast = {0: 1.0, 1: 1.1, 2: 0.9}
    slow = {0: 2.0, 1: 2.1, 2: 1.9}
    v = paired(fast, slow, ("fast", "slow"), lower_is_better=True)
    assert v.words == "fast ahead" and v.mean < 0
    assert str(v).startswith("fast ahead by 1.00 ± 0.00 (slow minus fast")


def test_the_winner_is_named_with_a_positive_margin_from_either_side():
    a, b = {0: 0.80, 1: 0.82, 2: 0.81}, {0: 0.70, 1: 0.71, 2: 0.72}
    names = ("batch 256", "batch 512")
    text = str(paired(a, b, names, scale=100, unit="points"))
    assert text == "batch 256 ahead by 10.00 ± 0.58 points (batch 256 minus batch 512, " \
                   "3 seeds, paired)"
    mirrored = str(paired(b, a, ("batch 512", "batch 256"), scale=100, unit="points"))
    assert mirrored == text and "ahead by -" not in mirrored and "ahead: -" not in mirrored


def test_by_seed_keeps_finished_records_only():
    recs = [SimpleNamespace(seed=0, status="ok", final_test_acc=0.8),
            SimpleNamespace(seed=1, status="diverged", final_test_acc=0.1)]
    assert by_seed(recs) == {0: 0.8}


def test_glue_stores_plain_python_values_and_verdict_sentences(monkeypatch):
    import numpy as np
    from mgpu_lib.book import verdict
    stored = {}
    monkeypatch.setattr(verdict, "_myst_glue",
                        lambda name, value, display: stored.update({name: (value, display)}))
    v = paired({0: 1.0, 1: 2.0}, {0: 0.0, 1: 0.5}, NAMES)
    verdict.glue("v", v)
    verdict.glue("x", np.float64(0.25))
    assert stored["v"] == (v.plain, False) and stored["v_how"] == (str(v), False)
    assert stored["x"] == (0.25, False) and type(stored["x"][0]) is float


def test_glue_without_myst_nb_stores_nothing_and_raises_nothing(monkeypatch):
    from mgpu_lib.book import verdict
    monkeypatch.setattr(verdict, "_myst_glue", None)
    assert verdict.glue("x", 1.0) is None


def test_a_side_without_a_finished_seed_says_so_and_shows_no_nan():
    v = paired({}, {0: 0.8, 1: 0.82}, ("lr 50", "lr 0.1"), scale=100, unit="points")
    assert v.winner is None and v.n == 0
    assert "lr 50: no finished seed" in str(v) and "nan" not in str(v).lower()
    u = unpaired([0.8, 0.81], [], ("A", "B"))
    assert "B: no finished seed" in str(u) and "nan" not in str(u).lower()
