"""Library code the pages print with `inspect.getsource` fits the book's 88 columns (a wider
line scrolls sideways in the built book; tools/check_layout.py fails on it)."""
import inspect
import json
from pathlib import Path

import pytest

from mgpu_lib import training
from mgpu_lib.book import verdict
from mgpu_lib.data import DeviceLoader
from mgpu_lib.perf.scaling import conv_peak_tflops

MAX_COLUMNS = 88
PRINTED = [training.make_step, training.fit, training.train]   # chapters/03_dataparallel


@pytest.mark.parametrize("function", PRINTED, ids=lambda f: f.__name__)
def test_printed_source_fits_the_column(function):
    wide = [line for line in inspect.getsource(function).splitlines()
            if len(line) > MAX_COLUMNS]
    assert not wide, wide


ROOT = Path(__file__).resolve().parent.parent
# What each page prints of the library's own text, by `inspect`: its stored output must be that
# text as the library holds it now (before: page 08 showed a docstring the code had rewritten).
SHOWN = [("chapters/02_devices.ipynb", inspect.getsource(training.make_model)),
         *[("chapters/03_dataparallel.ipynb", inspect.getsource(f)) for f in PRINTED],
         ("chapters/06_performance.ipynb", inspect.getsource(DeviceLoader.__iter__)),
         ("chapters/08_time_model.ipynb", inspect.getdoc(conv_peak_tflops)),
         ("chapters/09_verdicts.ipynb", inspect.getsource(verdict.decide))]


def _stored_words(notebook: str) -> str:
    cells = json.loads((ROOT / notebook).read_text(encoding="utf-8"))["cells"]
    texts = ["".join(o.get("text", "")) for c in cells if c["cell_type"] == "code"
             for o in c.get("outputs", [])]
    return " ".join(" ".join(texts).split())


@pytest.mark.parametrize("notebook, text", SHOWN, ids=[n for n, _ in SHOWN])
def test_a_page_shows_the_library_text_it_prints_as_it_is_now(notebook, text):
    """Compared word by word: a page may re-fill a docstring to its column."""
    assert " ".join(text.split()) in _stored_words(notebook), "re-execute " + notebook
