"""Make a bare `pytest --nbval` from the repository root behave like `make test`.

The smoke profile unless the caller set one (notebook kernels inherit the environment). With
`--nbval`, every page runs the Colab way, once (tests/nbval_colab.py), and the book is built and
checked (`MGPU_CHECK_BOOK=1`, tests/test_book.py) unless the caller said otherwise.
"""
import os

from tests.nbval_colab import configure

os.environ.setdefault("MGPU_PROFILE", "smoke")


def pytest_configure(config):
    if getattr(config.option, "nbval", False):
        os.environ.setdefault("MGPU_CHECK_BOOK", "1")    # everything: build the book too
    configure(config)
