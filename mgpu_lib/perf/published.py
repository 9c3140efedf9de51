"""Published timings of this section's setup (or a close one), each with a source a reader can
open. These are the only multi-GPU measurements this book has: no GPU is lent to it.

Every row is one printed line of a run (`test acc: A, S sec/epoch on [devices]`). Two rows of
the same `run` are one comparison (1 GPU, then 2). A field the source does not state is None,
never a guess. `hardware_source` says where the GPU model comes from when that is another file
of the same build.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

D2L_COLAB = "https://github.com/d2l-ai/d2l-pytorch-colab/blob/"
CONCISE = "/chapter_computational-performance/multiple-gpus-concise.ipynb"
D2L_NEU = "https://github.com/smolix/d2l-neu/blob/"
NEU_HARDWARE = (D2L_NEU + "e14d97f24ac8a55be975f608f4b481a0cc2e2e1f/chapter_computational-"
                "performance/hardware.md (section 'Interconnects: Our Box as the Worked "
                "Example': four RTX 4090s behind two PCIe host bridges, P2P disabled, no NVLink)")
NEU_CONCISE = "/chapter_computational-performance/multiple-gpus-concise.md"


@dataclass(frozen=True)
class PublishedRun:
    """One published line: `n_gpus` devices trained `epochs` epochs of Fashion-MNIST."""
    run: str                    # the comparison this row belongs to
    label: str                  # how the page names it
    framework: str              # "pytorch" (nn.DataParallel) or "mxnet" (Gluon, kvstore device)
    n_gpus: int
    batch: int                  # global batch
    lr: float
    sec_per_epoch: float        # as printed (d2l.Timer: training loop only, no evaluation)
    test_acc: Optional[float]
    gpu: Optional[str]          # the model as the source names it; None: not stated
    interconnect: Optional[str]
    p2p: Optional[bool]         # peer-to-peer between the GPUs; None: not stated
    image_size: int = 28        # Fashion-MNIST side after the loader's resize
    epochs: int = 10
    date: Optional[str] = None  # when the output was built (commit date)
    source: str = ""
    hardware_source: Optional[str] = None
    note: str = ""


def _d2l_en(commit: str, date: str, t1: float, a1: float, t2: float, a2: float,
            hardware: str) -> tuple[PublishedRun, PublishedRun]:
    """A d2l-en PyTorch build of 12.6 (the chapter's code: batch 256/lr 0.1, then 512/0.2)."""
    run, url = f"d2l-en {date[:7]}", D2L_COLAB + commit + CONCISE
    common = dict(run=run, label=f"d2l-en build, {date[:7]}", framework="pytorch",
                  gpu="Tesla V100-SXM2-16GB", interconnect=None, p2p=None, date=date,
                  source=url, hardware_source=D2L_COLAB + commit + hardware)
    return (PublishedRun(n_gpus=1, batch=256, lr=0.1, sec_per_epoch=t1, test_acc=a1, **common),
            PublishedRun(n_gpus=2, batch=512, lr=0.2, sec_per_epoch=t2, test_acc=a2, **common))


RUNS: tuple[PublishedRun, ...] = (
    *_d2l_en("f8543710a7046a947464f0fa3ad0f8619d7613d3", "2023-08-18", 12.2, 0.91, 7.5, 0.73,
             "/chapter_hyperparameter-optimization/std.out (same build: lists four "
             "Tesla V100-SXM2-16GB)"),
    *_d2l_en("1b94b19315eef593e6a29a3321676059103aa6f7", "2023-02-10", 14.0, 0.90, 8.8, 0.89,
             "/chapter_builders-guide/use-gpu.ipynb (same build: nvidia-smi shows Tesla "
             "V100-SXM2)"),
    *_d2l_en("0fbc120e6e7735778ff503666824384f29f185a2", "2022-12-15", 16.1, 0.92, 9.9, 0.76,
             "/chapter_builders-guide/use-gpu.ipynb (same build: nvidia-smi shows Tesla "
             "V100-SXM2)"),
    *(PublishedRun(run="d2l-neu 28px", label="d2l-neu rebuild, 28 px (May 2026)",
                   framework="pytorch", n_gpus=n, batch=b, lr=lr, sec_per_epoch=t, test_acc=a,
                   gpu="RTX 4090", interconnect="PCIe, staged through host memory", p2p=False,
                   date="2026-05-06",
                   source=D2L_NEU + "f2922b64b3bd408c40e41eaf287b6e706a045dfd/docs/"
                   "convergence-audit-2026-05-06.md (the rendered page's two lines, quoted)",
                   hardware_source=NEU_HARDWARE,
                   note="the chapter's code unchanged (setup: " + D2L_NEU +
                   "d2e80d66fae994426bbe8e478bf3cb3f9b8ae5d2" + NEU_CONCISE + ")")
      for n, b, lr, t, a in ((1, 256, 0.1, 5.8, 0.92), (2, 512, 0.2, 8.7, 0.87))),
    *(PublishedRun(run=f"d2l-neu 64px {d[:7]}", label=f"d2l-neu rebuild, 64 px ({d[:7]})",
                   framework="pytorch", n_gpus=n, batch=b, lr=lr, sec_per_epoch=t, test_acc=a,
                   gpu="RTX 4090", interconnect="PCIe, staged through host memory", p2p=False,
                   image_size=64, date=d,
                   source=D2L_NEU + c + "/outputs/pytorch/chapter_computational-performance/"
                   "multiple-gpus-concise.json", hardware_source=NEU_HARDWARE,
                   note="images resized to 64 x 64 (about 5.2x the FLOPs per image); setup: "
                   + D2L_NEU + c + NEU_CONCISE)
      for c, d, n, b, lr, t, a in (
          ("3a5fccc0d7e91f82f413021b3639fe83abf6ba72", "2026-05-29", 1, 512, 0.2, 29.3, 0.86),
          ("3a5fccc0d7e91f82f413021b3639fe83abf6ba72", "2026-05-29", 2, 1024, 0.4, 17.0, 0.88),
          ("3690b24b8ed8c28823d719e0b292f1598eab3454", "2026-07-07", 1, 512, 0.2, 52.7, 0.89),
          ("3690b24b8ed8c28823d719e0b292f1598eab3454", "2026-07-07", 2, 1024, 0.4, 26.9, 0.89))),
    *(PublishedRun(run="study notes", label="the study notes (2025)", framework="pytorch",
                   n_gpus=n, batch=b, lr=lr, sec_per_epoch=t, test_acc=a, gpu=None,
                   interconnect=None, p2p=None, date="2025-05-23",
                   source="'动手学深度学习12.6. 多GPU的简洁实现-笔记练习（PyTorch）', a reprinted blog "
                   "post dated 2025-05-23 (the original address is not given in the reprint)",
                   note="the chapter's code unchanged; the GPU is not named")
      for n, b, lr, t, a in ((1, 256, 0.1, 47.1, 0.90), (2, 512, 0.2, 25.6, 0.80))),
    *(PublishedRun(run="d2l 1-day course", label="d2l 1-day course, MXNet (2019)",
                   framework="mxnet", n_gpus=n, batch=b, lr=lr, sec_per_epoch=t, test_acc=a,
                   gpu=None, interconnect=None, p2p=None, date="2019-07-03",
                   source="https://github.com/d2l-ai/1day-notebooks/blob/0f9673dbb07989b442a289"
                   "a11e5279d0c27bfb5e/notebooks-3/3-multiple-gpus-gluon.ipynb",
                   note="Gluon, not DataParallel: each GPU's forward launched from one Python "
                   "loop, gradients summed by kvstore 'device'; the GPU is not named")
      for n, b, lr, t, a in ((1, 256, 0.1, 13.2, 0.93), (2, 512, 0.2, 7.3, 0.92))),
)


def runs(framework: Optional[str] = None) -> list[PublishedRun]:
    """Every published row, or those of one framework."""
    return [r for r in RUNS if framework in (None, r.framework)]


def pairs(rows: Optional[list[PublishedRun]] = None) -> list[tuple[PublishedRun, PublishedRun]]:
    """(1-GPU row, 2-GPU row) of each comparison, in table order."""
    rows = list(RUNS) if rows is None else rows
    order = list(dict.fromkeys(r.run for r in rows))
    by = {(r.run, r.n_gpus): r for r in rows}
    return [(by[(k, 1)], by[(k, 2)]) for k in order if (k, 1) in by and (k, 2) in by]


def pair(run: str) -> tuple[PublishedRun, PublishedRun]:
    """The comparison named `run` (e.g. 'd2l-en 2023-08', 'd2l-neu 28px', 'study notes')."""
    found = [p for p in pairs() if p[0].run == run]
    if not found:
        raise KeyError(f"no published run {run!r}; known: {[p[0].run for p in pairs()]}")
    return found[0]


def speedup(run: str) -> float:
    """Seconds per epoch on 1 GPU over seconds on 2, as published (> 1: 2 GPUs faster)."""
    one, two = pair(run)
    return one.sec_per_epoch / two.sec_per_epoch
