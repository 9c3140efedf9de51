"""Provenance for the book's records: the one header that says what produced a record
(package version, git revision, torch, the CPU by its name)."""
from __future__ import annotations

import functools
import os
import platform
import subprocess
from contextlib import suppress
from importlib import metadata
from pathlib import Path
from typing import Optional

import cpuinfo
import torch

SCHEMA = 2      # of the header below; a record without one is from before it (schema 1)
HEADER = ("schema", "mgpu_lib", "git", "torch", "hardware", "profile", "config")


def _git(*args: str, cwd: Path) -> Optional[str]:
    """A git command's output, or None if git is missing, slow or unhappy."""
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                             timeout=5, env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def code_version() -> dict:
    """{"mgpu_lib": version or None, "git": revision or None}, once per process, read only
    where the package tops its own clone. "+dirty": the package or tools differ from the commit
    (pages being rewritten do not count: page 01 executed in place had marked 02 to ex2)."""
    root = Path(__file__).resolve().parents[2]      # the clone holding mgpu_lib/lab/files.py
    rev, version = None, None
    with suppress(metadata.PackageNotFoundError):       # not installed
        version = metadata.version("mgpu_lib")
    if (root / ".git").exists() and _git("rev-parse", "--show-toplevel", cwd=root) == str(root):
        rev = _git("rev-parse", "--short=12", "HEAD", cwd=root)
        changes = _git("status", "--porcelain", "--untracked-files=no", "--", "mgpu_lib",
                       "tools", cwd=root)
        if rev and changes:
            rev += "+dirty"
    return {"mgpu_lib": version, "git": rev}


@functools.cache
def cpu_info() -> dict:
    """This CPU's `brand_raw` and `flags`, from py-cpuinfo (a second: it reads CPUID in a
    subprocess, so it is asked only where a record or a banner names the CPU)."""
    return cpuinfo.get_cpu_info()


def cpu_name() -> str:
    """The CPU's model name, e.g. 'AMD EPYC 7B13'."""
    return " ".join(cpu_info().get("brand_raw", "").split()) or platform.machine() or "unknown CPU"


def with_cpu_name(hardware: str) -> str:
    """The core's 'CPU (AVX512), ...' as a record says it: 'CPU: AMD EPYC 7B13 (AVX512), ...'."""
    return hardware.replace("CPU (", f"CPU: {cpu_name()} (", 1)


def record_header(*, hardware: str, profile: Optional[str], config: dict) -> dict:
    """The one header every record carries (a run, a sweep point, a benchmark), so any record
    can say what produced it, the CPU by its name. None means unknown (a copy outside its git
    repository)."""
    # str(): torch.__version__ is a TorchVersion, which a checkpoint's pickle refuses to load
    return {"schema": SCHEMA, **code_version(), "torch": str(torch.__version__),
            "hardware": with_cpu_name(hardware), "profile": profile, "config": dict(config)}


def stamp(record: dict) -> dict:
    """`record` as the store keeps it: a run's result (the core's `TrainResult`, no header) gets
    the header (`record_header`) of the code that stores it; a record with one keeps it."""
    if "schema" in record or "train_loss" not in record:
        return record
    return {**record, **record_header(hardware=record["hardware"],
                                      profile=record["config"].get("profile"),
                                      config=record["config"])}
