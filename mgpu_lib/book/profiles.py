"""Run profiles: how much work a notebook or command does on the hardware at hand.

`MGPU_PROFILE=smoke|cpu|full` picks one, else `full` with CUDA and `cpu` without. A profile
shrinks data, epochs and width, and sets batch size and lr; the code path stays the same."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch

from ..config import TrainConfig, resolve_switches
from ..lab.files import code_version, with_cpu_name
from ..devices import describe_devices, try_gpu


@dataclass(frozen=True)
class Profile:
    """Its run's settings (a `TrainConfig`, read through: `profile.width`), seeds and purpose."""
    name: str
    train: TrainConfig
    seeds: tuple[int, ...]       # for the comparisons that report a mean and spread
    about: str                   # what it is for

    def __post_init__(self):      # its runs carry its name, derived, never typed twice
        object.__setattr__(self, "train", self.train.replace(profile=self.name))

    def __getattr__(self, name: str):
        train = self.__dict__.get("train")     # absent while copying or unpickling
        if name.startswith("_") or not hasattr(train, name):
            raise AttributeError(f"'Profile' object has no attribute {name!r}")
        return getattr(train, name)

    def replace(self, **changes) -> Profile:
        """A copy with `changes`: to its name (its runs' `profile` too), seeds, or run settings."""
        own = {k: changes.pop(k) for k in ("name", "seeds", "about") if k in changes}
        return dataclasses.replace(self, train=self.train.replace(**changes), **own)

    def config(self, cls=TrainConfig, **overrides) -> TrainConfig:
        """This profile's settings as a `TrainConfig` (or `cls`, a subclass), `overrides` on top."""
        return cls(**{**self.train.to_dict(), **overrides})


PROFILES: dict[str, Profile] = {
    # smoke: half the images it had (4,000), about 15 CPU-seconds a run on one thread, so the
    # busiest page (03: five runs) executes in about 2 minutes on 2 cores.
    "smoke": Profile("smoke", TrainConfig(width=8, num_epochs=3, batch_size=32, lr=0.05,
                                          train_limit=2000, test_limit=500, allow_synthetic=True),
                     (0, 1), "CI and nbval: seconds per run on 2 CPU cores"),
    "cpu": Profile("cpu", TrainConfig(width=16, num_epochs=5, batch_size=128, lr=0.1,
                                      train_limit=10000, test_limit=2000),
                   (0, 1, 2), "a laptop without a GPU: a few minutes per run"),
    "full": Profile("full", TrainConfig(width=64, num_epochs=10, batch_size=256, lr=0.1),
                    (0, 1, 2), "the chapter's settings on GPUs"),
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


def banner(p: Profile) -> str:
    """Short lines for a notebook's setup cell: the profile; the hardware and the precision the
    fast path picks on it; the mgpu_lib it runs (the version a Colab page installed)."""
    precision = resolve_switches(p.train, try_gpu()).precision    # what "auto" picks here
    version = code_version()
    library = f"mgpu_lib {version['mgpu_lib'] or '(version unknown)'}" + (
        f", git {version['git']}" if version["git"] else "")
    return (f"profile: {p.name} ({p.about})\nhardware: {with_cpu_name(describe_devices())}; "
            f"{precision}\nlibrary: {library}")
