"""Library code the pages print with `inspect.getsource` fits the book's 88 columns (a wider
line scrolls sideways in the built book; tools/check_layout.py fails on it)."""
import inspect

import pytest

from mgpu_lib import training

MAX_COLUMNS = 88
PRINTED = [training.make_step, training.fit, training.train]   # chapters/03_dataparallel


@pytest.mark.parametrize("function", PRINTED, ids=lambda f: f.__name__)
def test_printed_source_fits_the_column(function):
    wide = [line for line in inspect.getsource(function).splitlines()
            if len(line) > MAX_COLUMNS]
    assert not wide, wide
