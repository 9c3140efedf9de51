"""Make a bare `pytest --nbval` from the repository root behave like `make test`.

The smoke profile unless the caller set one (notebook kernels inherit the environment). With
`--nbval`, every page runs the Colab way, once (tests/nbval_colab.py), and the book is built and
checked (`MGPU_CHECK_BOOK=1`, tests/test_book.py) unless the caller said otherwise.

Under pytest-xdist (two test processes, `addopts` in pyproject.toml) each process, and what it
starts (notebook kernels, torchrun's ranks), computes on its share of the cores: two processes of
two threads each on two cores made every OpenMP wait spin against the other (a smoke run took
62 s beside another, 24 s on one thread each). The slowest files are handed out first.
"""
import os

from tests.nbval_colab import configure

os.environ.setdefault("MGPU_PROFILE", "smoke")
if os.environ.get("PYTEST_XDIST_WORKER"):       # set before this file is read; torch not yet
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))

# The files that take longest, longest first (a `make test` run's --durations): handed out
# first, so that the short ones fill the gaps at the end.
SLOWEST = ("tests/test_layout.py", "tests/test_faults.py", "tests/test_ddp.py",
           "chapters/03_dataparallel.ipynb", "tests/test_colab.py", "chapters/05_ddp.ipynb",
           "tests/test_platforms.py", "tests/test_startup_kills.py", "tests/test_trace.py",
           "tests/test_fast_path.py", "exercises/ex1_hyperparameters.ipynb", "tests/test_train.py")


def pytest_configure(config):
    if getattr(config.option, "nbval", False):
        os.environ.setdefault("MGPU_CHECK_BOOK", "1")    # everything: build the book too
    configure(config)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOWEST)}
    items.sort(key=lambda item: rank.get(item.path.relative_to(config.rootpath).as_posix(),
                                         len(SLOWEST)))     # stable: the rest in their order
