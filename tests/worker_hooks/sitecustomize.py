"""Tests only (tests/ddp_helpers.HOOKS on PYTHONPATH): a DDP rank of rank MGPU_TEST_RANK
(default 0) raises MGPU_TEST_RAISE ("torch.cuda.OutOfMemoryError: message") where it would
train: `training.fit` is replaced before `python -m mgpu_lib.ddp` imports it."""
import os

if os.environ.get("MGPU_TEST_RAISE") and \
        os.environ.get("RANK") == os.environ.get("MGPU_TEST_RANK", "0"):
    import importlib

    import mgpu_lib.training

    def _raise(*args, **kw):
        name, _, message = os.environ["MGPU_TEST_RAISE"].partition(": ")
        module, _, cls = name.rpartition(".")
        raise getattr(importlib.import_module(module or "builtins"), cls)(message)

    mgpu_lib.training.fit = _raise
