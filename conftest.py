"""Make a bare `pytest --nbval` behave like `make test`: the smoke profile unless one is set.

Notebook kernels inherit this environment, so the notebooks run under the same profile.
"""
import os

os.environ.setdefault("MGPU_PROFILE", "smoke")
