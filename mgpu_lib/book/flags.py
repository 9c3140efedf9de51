"""The command lines' own options (not `TrainConfig`'s settings, whose flags `ddp.add_flags`
derives from their fields): what values each takes, said in one line where it is wrong."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from ..config import SEED_MAX, _int, is_number
from ..ddp import READ, kind


def argtype(parse: Callable[[str], Any]):
    """`parse` as an argparse type: its ValueError is one line naming the flag."""
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return convert


@dataclass(frozen=True)
class Check:
    """What values an option takes (`ok`), said as "must be <words>"; `convert` reads the
    command line's text. Called, it is an argparse type."""
    words: str
    ok: Callable[[Any], bool]
    convert: Callable[[str], Any]

    def parse(self, text: str):
        try:
            value = self.convert(text.strip())
        except ValueError:
            value = None
        if value is None or not self.ok(value):
            raise ValueError(f"must be {self.words}, got {text!r}")
        return value

    def __call__(self, text: str):
        return argtype(self.parse)(text)


POSITIVE_INT = Check("a positive integer", lambda v: _int(v) and v >= 1, int)
COUNT = Check("an integer >= 0", lambda v: _int(v) and v >= 0, int)
SEED = Check("an integer from 0 to 2**63 - 1", lambda v: _int(v) and 0 <= v <= SEED_MAX, int)
POSITIVE_NUMBER = Check("a positive number", lambda v: is_number(v) and v > 0, float)
NONNEGATIVE_NUMBER = Check("a finite number >= 0", lambda v: is_number(v) and v >= 0, float)


def on_cli(cls) -> list[dataclasses.Field]:                  # the settings that have a flag
    return [f for f in dataclasses.fields(cls) if f.metadata.get("cli", True)]


def read_setting(f: dataclasses.Field, text: str):
    """A setting's value from text, as its flag reads it (a ValueError if it cannot be)."""
    try:
        return READ[kind(f)](text.strip())
    except (ValueError, argparse.ArgumentTypeError) as e:
        raise ValueError(str(e) or f"cannot read {text!r}") from None
