"""What the prose may say: the book's one verdict rule, and `glue` to put it on the page.

Is A ahead of B, B ahead of A, or can the seeds not tell? Separately trained runs are compared
by the difference of their means with Welch's standard error; A minus B seed by seed (paired)
only where the design pairs them (`compare(..., pair=True)`: one network read two ways), never
because the runs it then judges happen to correlate. A side is ahead only when the mean
difference passes Student's t (two-sided 95%) times its standard error, so with no real
difference a winner is named 1 time in 20 whatever the number of seeds (`false_call_rate`).
An undecided result names the smallest gap its seeds could call and how often a true gap that
size is called (`power`, about half), never "no effect"; one seed decides nothing; `holm`
holds several verdicts together. A verdict has two forms: plain words for the lesson layer
(`Verdict.plain`, from the `PLAIN` templates) and the full statement for the evidence layer
(`str(verdict)`). Every verdict on a page is glued, never typed: `glue("warmup", v)` stores
both, then {glue:text}`warmup` in the prose and {glue:text}`warmup_how` in a dropdown."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping, Sequence

from scipy import integrate, stats

from .store import mean_std_se, plural

try:  # myst-nb stores glued values for the book; Colab and plain Jupyter build no book
    from myst_nb import glue as _myst_glue
except ImportError:
    _myst_glue = None

LEVEL = 0.95             # two-sided: a winner is named 1 time in 20 when there is none
APART = "cannot be told apart"
# `Verdict.plain`'s words: templates with named arguments, so that a translated edition fills
# the same numbers into its own words.
PLAIN = {
    "ahead": "{winner} is clearly ahead, by about {gap}{unit}",
    "apart": "these seeds cannot tell {a} and {b} apart",
    "one": "one seed is too few to tell {a} and {b} apart",
    "missing": "{missing} finished no seed, so nothing can be said",
}


def t_critical(dof: float, level: float = LEVEL) -> float:
    """Student's t quantile that a |mean| / se must pass: 12.71 at 1 degree of freedom,
    4.30 at 2, 2.57 at 5, 1.96 with many."""
    return float(stats.t.ppf(0.5 + level / 2, dof))


def false_call_rate(n: int, cut: float) -> float:
    """How often |mean| > cut x se names a winner among `n` paired seeds when there is no
    difference: P(|t_(n-1)| > cut). The t rule's cut gives 1 - LEVEL at every n."""
    return float(2 * stats.t.sf(cut, n - 1))


@functools.lru_cache(maxsize=256)
def power(dof: float, level: float = LEVEL) -> float:
    """How often the rule calls a true gap of t x the true standard error, with `dof` degrees
    of freedom: 0.68 at 1, 0.61 at 2, towards 0.50. P(|Z + t| > t sqrt(V / dof)), V ~ chi²(dof)."""
    t = t_critical(dof, level)

    def called(v: float) -> float:
        cut = t * math.sqrt(v / dof)
        return (stats.norm.sf(cut - t) + stats.norm.cdf(-cut - t)) * stats.chi2.pdf(v, dof)
    return float(integrate.quad(called, 0, math.inf)[0])


def correlation(a: Mapping, b: Mapping) -> float:
    """Pearson's r over the seeds both hold (nan below 3 seeds, or where a side is constant)."""
    seeds = sorted(set(a) & set(b))
    x, y = [float(a[s]) for s in seeds], [float(b[s]) for s in seeds]
    if len(seeds) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return math.nan
    return float(stats.pearsonr(x, y).statistic)


def pairing_pays(r: float, n: int) -> bool:
    """Pair by seed only where r is above zero at one-sided 95% over the `n` shared seeds:
    uncorrelated pairs only lose degrees of freedom (n - 1 against Welch's up to 2n - 2)."""
    if n < 3 or math.isnan(r) or r <= 0:
        return False
    if r >= 1:
        return True
    t = r * math.sqrt((n - 2) / (1 - r * r))
    return float(stats.t.sf(t, n - 2)) < 1 - LEVEL


@dataclass(frozen=True)
class Verdict:
    """A against B: the mean difference A - B (times `scale`), its standard error, the
    number of seeds (pairs when `paired`), and the words the rule chose."""

    names: tuple[str, str]
    mean: float
    se: float
    n: int
    paired: bool
    words: str
    unit: str = ""
    dof: float = math.nan     # of the t distribution the rule used
    level: float = LEVEL      # the confidence it was held to (stricter under `holm`)
    family: int = 1           # verdicts on the same seeds held together (`holm`)
    r: float = math.nan       # correlation of the two sides' runs over their shared seeds

    @property
    def detectable(self) -> float:
        """The smallest observed |A - B| these seeds would have called: t x se (nan without
        a spread between seeds to measure it by)."""
        if self.n < 2 or not self.se > 0 or math.isnan(self.dof):
            return math.nan
        return t_critical(self.dof, self.level) * self.se

    @property
    def power(self) -> float:
        """How often a true gap of `detectable` would be called: about half (`power`)."""
        return math.nan if math.isnan(self.detectable) else power(self.dof, self.level)

    @property
    def p(self) -> float:
        """Two-sided p-value of the mean difference (nan where the rule has no t)."""
        if self.n < 2 or math.isnan(self.dof) or math.isnan(self.se):
            return math.nan
        if self.se == 0:
            return 0.0 if self.mean else 1.0
        return float(2 * stats.t.sf(abs(self.mean) / self.se, self.dof))

    @property
    def plain(self) -> str:
        """The verdict in plain words, from `PLAIN`: 'A is clearly ahead, by about 13 points',
        'these seeds cannot tell A and B apart'. The margin is rounded to 2 significant figures."""
        a, b = self.names
        if self.n == 0:
            return PLAIN["missing"].format(missing=self.words.split(": no finished seed")[0])
        if self.winner is not None:
            unit = f" {self.unit}" if self.unit else ""
            return PLAIN["ahead"].format(winner=self.winner, gap=about(abs(self.mean)), unit=unit)
        return PLAIN["one" if self.n < 2 else "apart"].format(a=a, b=b)

    @property
    def winner(self) -> str | None:
        """The name of the side ahead, or None when the seeds cannot tell."""
        return next((name for name in self.names if self.words == f"{name} ahead"), None)

    def __str__(self) -> str:
        """'A ahead by 4.00 ± 1.73 points (A minus B, 3 seeds, paired)', the margin positive;
        or 'cannot be told apart: A minus B = ...; the smallest gap these seeds could call is ...'."""
        if self.n == 0:          # a side with no finished seed: there is no number to show
            return self.words
        unit = f" {self.unit}" if self.unit else ""
        seeds = f"{plural(self.n, 'seed')}, {'paired' if self.paired else 'unpaired'}"
        if not self.paired and not math.isnan(self.r):    # shared seeds, not worth pairing
            seeds += f", r = {self.r:+.2f}"
        if self.family > 1:
            seeds += f"; Holm over {self.family} verdicts"
        a, b, mean = *self.names, self.mean
        if self.winner is not None and mean < 0:    # the margin positive: B minus A
            a, b, mean = b, a, -mean
        spread = ", no standard error" if math.isnan(self.se) else f" ± {self.se:.2f}"
        if self.winner is not None:
            return f"{self.winner} ahead by {mean:.2f}{spread}{unit} ({a} minus {b}, {seeds})"
        text = f"{self.words}: {a} minus {b} = {mean:+.2f}{spread}{unit} ({seeds})"
        if not math.isnan(self.detectable):
            text += (f"; the smallest gap these seeds could call is {self.detectable:.2f}{unit},"
                     f" and a true gap that size is called {self.power:.0%} of the time")
        elif self.n >= 2 and self.se == 0:
            text += "; every seed gave the same difference, so the seeds size no gap"
        return text


def about(x: float) -> str:
    """`x` to 2 significant figures, as a reader says it: 12.81 -> '13', 6.80 -> '6.8'."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    digits = max(0, 1 - math.floor(math.log10(abs(x))))
    return f"{round(x, digits):.{digits}f}"


def decide(mean: float, se: float, names: tuple[str, str], n: int,
           lower_is_better: bool = False, dof: float | None = None,
           level: float = LEVEL) -> str:
    """The rule itself: the words for a mean difference A - B, its standard error,
    and the t distribution's degrees of freedom (default n - 1, the paired case)."""
    if n < 2:
        return f"one seed: {APART}" if n == 1 else f"no seeds: {APART}"
    _check(mean, se, names)
    if abs(mean) <= t_critical(n - 1 if dof is None else dof, level) * se:
        return APART
    a_larger = mean > 0
    return f"{names[0] if a_larger != lower_is_better else names[1]} ahead"


def _check(mean: float, se: float, names: Sequence[str]) -> None:
    """A rule's input that means nothing is a ValueError, never a verdict."""
    if not math.isfinite(mean) or not se >= 0 or math.isinf(se):
        raise ValueError(f"a verdict needs a finite mean and a standard error >= 0, "
                         f"got mean {mean!r}, se {se!r}")
    if len(names) != 2 or names[0] == names[1]:
        raise ValueError(f"a verdict needs two different names, got {tuple(names)!r}")


def _no_finished_seed(a, b, names) -> Verdict | None:
    """The verdict when a side has no finished seed, else None."""
    missing = [name for name, side in zip(names, (a, b)) if not len(side)]
    if not missing:
        return None
    return Verdict(tuple(names), math.nan, math.nan, 0, True,
                   f"{' and '.join(missing)}: no finished seed (diverged or failed); {APART}")


def paired(a: Mapping, b: Mapping, names: tuple[str, str] = ("A", "B"), *,
           scale: float = 1.0, unit: str = "", lower_is_better: bool = False) -> Verdict:
    """A against B over the seeds both hold (`a` and `b` map seed -> value). `scale`
    multiplies the differences (100 turns accuracies into points); set `lower_is_better` for
    times, so that the faster side is the one ahead."""
    if (empty := _no_finished_seed(a, b, names)) is not None:
        return empty
    diffs = [scale * (float(a[s]) - float(b[s])) for s in sorted(set(a) & set(b))]
    mean, _, se = mean_std_se(diffs)
    words = decide(mean, se, names, len(diffs), lower_is_better)
    return Verdict(tuple(names), mean, se, len(diffs), True, words, unit, len(diffs) - 1,
                   r=correlation(a, b))


def unpaired(a: Sequence[float], b: Sequence[float], names: tuple[str, str] = ("A", "B"),
             *, scale: float = 1.0, unit: str = "",
             lower_is_better: bool = False, r: float = math.nan) -> Verdict:
    """A against B as independent runs: the difference of the means, with Welch's standard
    error sqrt(sa²/na + sb²/nb) and Welch-Satterthwaite's degrees of freedom. `n` is the
    smaller side's number of seeds; `r`, where the sides share seeds, their correlation."""
    if (empty := _no_finished_seed(a, b, names)) is not None:
        return empty
    a, b = [float(scale * v) for v in a], [float(scale * v) for v in b]
    (ma, _, sea), (mb, _, seb) = mean_std_se(a), mean_std_se(b)
    mean, se, n = ma - mb, math.hypot(sea, seb), min(len(a), len(b))
    # Welch-Satterthwaite: (sa²/na + sb²/nb)² / sum((s²/n)² / (n - 1)); nan below 2 a side
    va, vb = sea ** 2, seb ** 2
    dof = (math.nan if n < 2 else float(len(a) + len(b) - 2) if va + vb == 0
           else (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1)))
    words = decide(mean, se, names, n, lower_is_better, dof)
    return Verdict(tuple(names), mean, se, n, False, words, unit, dof, r=r)


def compare(a: Mapping, b: Mapping, names: tuple[str, str] = ("A", "B"), *,
            pair: bool = False, **kwargs) -> Verdict:
    """The book's verdict on two settings over seeds ({seed: value} each): Welch's unpaired
    test, with the correlation kept (`Verdict.r`); paired only by design (`pair=True`), never
    by a pre-test on the same runs (with no true gap, 1 in 4 of the comparisons it pairs at 3
    to 5 seeds names a false winner)."""
    if pair:
        return paired(a, b, names, **kwargs)
    return unpaired(list(a.values()), list(b.values()), names, r=correlation(a, b), **kwargs)


def holm(verdicts: Sequence[Verdict], level: float = LEVEL) -> list[Verdict]:
    """Several verdicts on the same seeds, held together by Holm's step-down (the chance of any
    false winner stays 1 - `level`); each comes back, in order, with the level it was held to."""
    m, alpha = len(verdicts), 1 - level
    order = sorted(range(m), key=lambda i: (math.isnan(verdicts[i].p), verdicts[i].p))
    out, going = [None] * m, True
    for k, i in enumerate(order):
        v = verdicts[i]
        step = 1 - alpha / (m - k)
        going = going and v.winner is not None and v.p <= alpha / (m - k)
        out[i] = replace(v, level=step, family=m,
                         words=v.words if going or v.winner is None else APART)
    return out


def by_seed(records: Iterable, value: Callable = lambda r: r.final_test_acc) -> dict:
    """{seed: value(record)} for the finished records of one configuration."""
    return {r.seed: value(r) for r in records if r.status == "ok"}


def glue(name: str, value) -> None:
    """Store `value` under `name` for the page's prose, shown nowhere else: a Verdict as its
    plain words, and its full statement under `name_how`; a numpy scalar as a Python number
    (myst-nb formats only what `literal_eval` reads). Without myst-nb, nothing."""
    if isinstance(value, Verdict):
        glue(f"{name}_how", str(value))
        value = value.plain
    elif hasattr(value, "item"):
        value = value.item()
    if _myst_glue is not None:
        _myst_glue(name, value, display=False)
