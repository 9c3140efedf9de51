"""Small result tables that render as Markdown in notebooks and the book, and as text elsewhere.
The caption follows in italics (`_ext/`'s `numbered_tables` numbers it, "Table 3.1")."""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from .style import SYNTHETIC, synthetic


class Table:
    """Rows under headers. Jupyter shows `_repr_markdown_`; `str()` gives aligned plain text.

    A column (not the first) that holds one value in every row of 2+ moves into the caption as
    "header: value", unless `keep_constant`. `records`: the runs the rows come from; the caption
    says so when any of them trained on synthetic data.
    """

    def __init__(self, headers: Sequence[str], rows: Sequence[Sequence[Any]], caption: str = "",
                 keep_constant: bool = False, records: Sequence = ()):
        self.headers = [str(h) for h in headers]
        self.rows = [[fmt(v) for v in row] for row in rows]
        # the caption, then whether the runs behind the table are not real, then constant columns
        notes = [caption, SYNTHETIC if synthetic(records) else ""]
        constant = [j for j in range(1, len(self.headers)) if not keep_constant
                    and len(self.rows) > 1 and len({row[j] for row in self.rows}) == 1
                    and self.rows[0][j]]
        if constant and len(constant) < len(self.headers) - 1:  # keep a column of values
            notes += [f"{self.headers[j]}: {self.rows[0][j]}" for j in constant]
            keep = [j for j in range(len(self.headers)) if j not in constant]
            self.headers = [self.headers[j] for j in keep]
            self.rows = [[row[j] for j in keep] for row in self.rows]
        self.caption = "; ".join(filter(None, notes))

    def _repr_markdown_(self) -> str:
        lines = ["| " + " | ".join(self.headers) + " |",
                 "|" + "|".join("---" for _ in self.headers) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        if self.caption:
            lines += ["", f"*{self.caption}*"]
        return "\n".join(lines)

    def __str__(self) -> str:
        widths = [max(map(len, col)) for col in zip(self.headers, *self.rows)]
        fmt_row = lambda row: "  ".join(c.rjust(w) for c, w in zip(row, widths))
        lines = [fmt_row(self.headers), fmt_row(["-" * w for w in widths])]
        lines += [fmt_row(r) for r in self.rows]
        return "\n".join(lines + ([self.caption] if self.caption else []))

    __repr__ = __str__


def fmt(value: Any) -> str:
    """A table cell: floats to three significant figures (1,250, 935, 89.8, 0.812), ints with
    thousands separators, nan as "n/a", anything else as str()."""
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if math.isinf(value) or abs(value) < 1000:
            return f"{value:.3g}"
        digits = math.floor(math.log10(abs(value))) - 2   # keep three significant figures
        return f"{round(value, -digits):,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def mean_std(mean: float, std: Optional[float] = None) -> str:
    """"0.770 ± 0.050": the mean to three significant figures, the std to its decimals;
    "diverged" where there is no mean (every seed diverged); the mean alone without a std."""
    if math.isnan(mean):
        return "diverged"
    mean = float(mean)  # three significant figures, trailing zeros kept: 0.770, not 0.77
    text = f"{mean:#.3g}".rstrip(".") if abs(mean) < 1000 else fmt(mean)
    if std is None or math.isnan(std):
        return text
    decimals = len(text.split(".")[1]) if "." in text else 0
    return f"{text} ± {std:.{decimals}f}"
