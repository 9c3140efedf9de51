"""Run profiles: how much work a notebook or command does on the hardware at hand.

`MGPU_PROFILE=smoke|cpu|full` picks one, else `full` with CUDA and `cpu` without. A profile
shrinks data, epochs and width, and sets batch size and lr; the code path stays the same."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Optional

import torch

from ..config import TrainConfig
from ..lab.files import code_version
from ..devices import autocast_dtype, describe_devices, try_gpu


@dataclass(frozen=True)
class Profile:
    name: str
    width: int                   # channels of the first ResNet stage (64 = the chapter's model)
    num_epochs: int
    batch_size: int              # global batch, images per step
    lr: float
    train_limit: Optional[int]   # class-balanced training subset; None = all 60,000 images
    test_limit: Optional[int]    # class-balanced test subset; None = all 10,000 images
    seeds: tuple[int, ...]       # seeds for comparisons that report mean and spread
    allow_synthetic: bool        # fall back to synthetic data when no real copy is found
    about: str

    def config(self, cls=TrainConfig, **overrides) -> TrainConfig:
        """A `TrainConfig` (or `cls`) with this profile's settings, `overrides` on top."""
        base = {k: v for k, v in asdict(self).items() if k not in ("name", "seeds", "about")}
        return cls(**{**base, "profile": self.name, **overrides})


PROFILES: dict[str, Profile] = {
    # smoke: half the images it had (4,000), about 15 CPU-seconds a run on one thread, so the
    # busiest page (03: five runs) executes in about 2 minutes on 2 cores.
    "smoke": Profile("smoke", width=8, num_epochs=3, batch_size=32, lr=0.05,
                     train_limit=2000, test_limit=500, seeds=(0, 1), allow_synthetic=True,
                     about="CI and nbval: seconds per run on 2 CPU cores"),
    "cpu": Profile("cpu", width=16, num_epochs=5, batch_size=128, lr=0.1,
                   train_limit=10000, test_limit=2000, seeds=(0, 1, 2), allow_synthetic=False,
                   about="a laptop without a GPU: a few minutes per run"),
    "full": Profile("full", width=64, num_epochs=10, batch_size=256, lr=0.1,
                    train_limit=None, test_limit=None, seeds=(0, 1, 2), allow_synthetic=False,
                    about="the chapter's settings on GPUs"),
}


def get_profile(name: str) -> Profile:
    """The profile called `name`; an unknown name is a ValueError listing the valid ones."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; valid profiles: {', '.join(PROFILES)}")
    return PROFILES[name]


def active_profile() -> Profile:
    """`MGPU_PROFILE` if set, else `full` with CUDA and `cpu` without."""
    name = os.environ.get("MGPU_PROFILE", "").strip()
    return get_profile(name or ("full" if torch.cuda.is_available() else "cpu"))


def banner(profile: Optional[Profile] = None) -> str:
    """Short lines for a notebook's setup cell: the profile; the hardware and the precision the
    fast path picks on it; the mgpu_lib it runs (the version a Colab page installed)."""
    p = profile or active_profile()
    precision = {"bf16": "bf16 autocast", "fp16": "fp16 autocast + GradScaler"}.get(
        autocast_dtype(try_gpu()), "fp32")
    version = code_version()
    library = f"mgpu_lib {version['mgpu_lib'] or '(version unknown)'}" + (
        f", git {version['git']}" if version["git"] else "")
    return (f"profile: {p.name} ({p.about})\nhardware: {describe_devices()}; {precision}\n"
            f"library: {library}")
