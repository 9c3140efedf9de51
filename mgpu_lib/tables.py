"""Small result tables that render as Markdown in notebooks and the book, and as text elsewhere."""
from __future__ import annotations

from typing import Any, Sequence


class Table:
    """Rows under headers. Jupyter shows `_repr_markdown_`; `str()` gives aligned plain text."""

    def __init__(self, headers: Sequence[str], rows: Sequence[Sequence[Any]], caption: str = ""):
        self.headers = [str(h) for h in headers]
        self.rows = [[_fmt(v) for v in row] for row in rows]
        self.caption = caption

    def _repr_markdown_(self) -> str:
        lines = ["| " + " | ".join(self.headers) + " |",
                 "|" + "|".join("---" for _ in self.headers) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        if self.caption:
            lines += ["", f"*{self.caption}*"]
        return "\n".join(lines)

    def __str__(self) -> str:
        cols = list(zip(self.headers, *self.rows))
        widths = [max(len(c) for c in col) for col in cols]
        fmt = lambda row: "  ".join(c.rjust(w) for c, w in zip(row, widths))
        lines = [fmt(self.headers), fmt(["-" * w for w in widths])] + [fmt(r) for r in self.rows]
        return "\n".join(lines + ([self.caption] if self.caption else []))

    __repr__ = __str__


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)
