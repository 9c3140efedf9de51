"""Tests only (tests/ddp_helpers.HOOKS on PYTHONPATH): a DDP worker of rank MGPU_TEST_RANK
(default 0) raises MGPU_TEST_RAISE ("torch.OutOfMemoryError: message") instead of training."""
import os

if os.environ.get("MGPU_TEST_RAISE") and \
        os.environ.get("RANK") == os.environ.get("MGPU_TEST_RANK", "0"):
    import importlib

    import mgpu_lib.ddp

    def _raise(*args, **kw):
        name, _, message = os.environ["MGPU_TEST_RAISE"].partition(": ")
        module, _, cls = name.rpartition(".")
        raise getattr(importlib.import_module(module or "builtins"), cls)(message)

    mgpu_lib.ddp._fit = _raise
