"""Shared fixtures: the offline Fashion-MNIST copy, when this machine has one."""
import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def fashion_dir() -> Path:
    """The folder named by MGPU_FASHION_MNIST_DIR; tests that need real data skip without it."""
    d = os.environ.get("MGPU_FASHION_MNIST_DIR")
    if not d or not Path(d).is_dir():
        pytest.skip("MGPU_FASHION_MNIST_DIR is not set to the offline Fashion-MNIST copy")
    return Path(d)
