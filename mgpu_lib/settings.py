"""Settings declared once: a config field's default, help and check, as dataclass field metadata.

    @dataclass(frozen=True)
    class Config:
        lr: float = setting(0.1, POSITIVE_NUMBER, "learning rate")

        def __post_init__(self):
            validate(self)

`validate` checks every declared field of a config; the command line (`__main__`) builds its
flags from the same declarations (`declared`), and parses their text with the same checks, so a
new field is one edit: its flag, its validation and its `--vary` key follow.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

SEED_MAX = 2 ** 63 - 1          # torch.manual_seed takes up to 2**64 - 1; keep it signed-safe


@dataclass(frozen=True)
class Check:
    """What values a setting takes: `ok(value)` for Python values, `parse(text)` for the command
    line's text, `words` to say it ("must be <words>") and `metavar` to show it in help."""
    words: str
    ok: Callable[[Any], bool]
    convert: Callable[[str], Any]
    metavar: str = "VALUE"

    def parse(self, text: str):
        """`text` as a value, or a ValueError saying what was expected."""
        try:
            value = self.convert(text.strip())
        except (ValueError, OverflowError):
            value = None
        if value is None or not self.ok(value):
            raise ValueError(f"must be {self.words}, got {text!r}")
        return value

    def check(self, name: str, value) -> None:
        if not self.ok(value):
            raise ValueError(f"{name} must be {self.words}, got {value!r}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


_TRUE, _FALSE = ("true", "on", "yes", "1"), ("false", "off", "no", "0")


def _to_bool(text: str) -> Optional[bool]:
    t = text.lower()
    return True if t in _TRUE else False if t in _FALSE else None


POSITIVE_INT = Check("a positive integer", lambda v: _is_int(v) and v >= 1, int, "N")
COUNT = Check("an integer >= 0", lambda v: _is_int(v) and v >= 0, int, "N")
SEED = Check("an integer from 0 to 2**63 - 1", lambda v: _is_int(v) and 0 <= v <= SEED_MAX,
             int, "N")
POSITIVE_NUMBER = Check("a positive number", lambda v: _is_number(v) and v > 0, float, "X")
NONNEGATIVE_NUMBER = Check("a finite number >= 0", lambda v: _is_number(v) and v >= 0, float,
                           "X")
FLAG = Check("true or false (on/off)", lambda v: isinstance(v, bool), _to_bool, "on|off")
AUTO_FLAG = Check("true, false or 'auto' (on/off/auto)",
                  lambda v: isinstance(v, bool) or v == "auto",
                  lambda t: "auto" if t.lower() == "auto" else _to_bool(t), "on|off|auto")
NAME = Check("a name (a string)", lambda v: isinstance(v, str), str, "NAME")


def one_of(*choices: str) -> Check:
    return Check(f"one of {', '.join(choices)}", lambda v: v in choices, str, "|".join(choices))


def setting(default, check: Check, help: str, *, optional: bool = False,
            flag: Optional[str] = None, cli: bool = True):
    """A dataclass field declared once. `optional`: None is allowed too (meaning a default
    chosen at run time). `flag`: the command-line name (default `--field-name`); `cli=False`
    keeps the field off the command line."""
    return dataclasses.field(default=default, metadata=dict(
        check=check, help=help, optional=optional, flag=flag, cli=cli))


def declared(cls_or_obj) -> list[dataclasses.Field]:
    """The fields of a config that were declared with `setting`."""
    return [f for f in dataclasses.fields(cls_or_obj) if "check" in f.metadata]


def on_cli(cls_or_obj) -> list[dataclasses.Field]:
    """The declared fields that are command-line flags."""
    return [f for f in declared(cls_or_obj) if f.metadata["cli"]]


def flag_name(f: dataclasses.Field) -> str:
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def validate(config) -> None:
    """Raise a ValueError naming the first declared field whose value its check refuses."""
    for f in declared(config):
        value = getattr(config, f.name)
        if not (value is None and f.metadata["optional"]):
            f.metadata["check"].check(f.name, value)
