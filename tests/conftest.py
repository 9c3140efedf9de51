"""Shared fixtures: the offline Fashion-MNIST copy, when this machine has one, and the book
built once for the tests that read it."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def fashion_dir() -> Path:
    """The folder named by MGPU_FASHION_MNIST_DIR; tests that need real data skip without it."""
    d = os.environ.get("MGPU_FASHION_MNIST_DIR")
    if not d or not Path(d).is_dir():
        pytest.skip("MGPU_FASHION_MNIST_DIR is not set to the offline Fashion-MNIST copy")
    return Path(d)


@pytest.fixture(scope="session")
def built_book(tmp_path_factory) -> Path:
    """The book as `make book` builds it (`jupyter-book build -W --keep-going`: a warning
    fails), once a test process, into a folder of its own: under pytest-xdist two processes
    may build it at once, and `make book`'s `_build/` is left alone. Its `html` folder; a
    build that fails fails the test that asked for it, with the build's last lines."""
    out = tmp_path_factory.mktemp("book")
    jb = Path(sys.executable).parent / "jupyter-book"
    run = subprocess.run([str(jb), "build", str(ROOT), "-W", "--keep-going", "--path-output",
                          str(out)], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    return out / "_build" / "html"
