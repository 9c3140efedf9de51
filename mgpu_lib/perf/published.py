"""Published timings of this section's setup (or a close one), each with a source a reader can
open: the book's only multi-GPU measurements.

d2l's builds of 12.6 are `recorded/d2l_builds.csv` (`builds`): every PyTorch and MXNet build in
d2l's build repositories, checked against its executed notebook at its commit, the GPU from the
`nvidia-smi` output that commit printed; the other sources are `OTHERS`. Each row of `runs` is
one printed line of a run; a field the source does not state is None, never a guess."""
from __future__ import annotations

import csv
import functools
import io
from dataclasses import dataclass, fields
from importlib import resources
from typing import Optional

GITHUB = "https://github.com/"
D2L_NEU = GITHUB + "smolix/d2l-neu/blob/"
NEU_HARDWARE = (D2L_NEU + "e14d97f24ac8a55be975f608f4b481a0cc2e2e1f/chapter_computational-"
                "performance/hardware.md (section 'Interconnects: Our Box as the Worked "
                "Example': four RTX 4090s behind two PCIe host bridges, P2P disabled, no NVLink)")
NEU_CONCISE = "/chapter_computational-performance/multiple-gpus-concise.md"
COURSE = GITHUB + "d2l-ai/1day-notebooks/blob/0f9673dbb07989b442a289a11e5279d0c27bfb5e/"


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
    hardware_source: Optional[str] = None   # where the GPU model is printed, if another file
    note: str = ""
    repo: str = ""              # where it was published: a repository, or the reprint's name


@dataclass(frozen=True)
class Build:
    """One d2l build of 12.6, a row of `recorded/d2l_builds.csv` (its columns, typed)."""
    framework: str
    repo: str
    commit: str
    commit_date: str
    executed: Optional[str]     # the notebook's own execution time, where it records one
    notebook_path: str
    epochs: int
    batch_1: int
    lr_1: float
    sec_per_epoch_1: float
    test_acc_1: float
    batch_2: int
    lr_2: float
    sec_per_epoch_2: float
    test_acc_2: float
    gpu: Optional[str]          # as printed (nvidia-smi truncates: "Tesla V100-SXM2...")
    gpus_listed: Optional[int]
    hardware_source: Optional[str]   # the file of the same commit that printed the GPU
    code_group: str             # builds whose 12.6 code is the same share a group
    lazy_layers: bool
    net_reused: bool
    note: str

    @property
    def source(self) -> str:
        """The executed notebook at its commit, on GitHub."""
        return f"{GITHUB}{self.repo}/blob/{self.commit}/{self.notebook_path}"

    def lines(self) -> tuple[PublishedRun, PublishedRun]:
        """Its two printed lines (1 GPU, then 2) as `PublishedRun` rows."""
        name = self.repo.split("/")[-1]
        hardware = (f"{GITHUB}{self.repo}/blob/{self.commit}/{self.hardware_source}"
                    if self.hardware_source else None)
        return _lines(((1, self.batch_1, self.lr_1, self.sec_per_epoch_1, self.test_acc_1),
                       (2, self.batch_2, self.lr_2, self.sec_per_epoch_2, self.test_acc_2)),
                      run=f"{name} {self.commit[:7]}", label=f"{name}, {self.commit_date[:10]}",
                      framework=self.framework, gpu=self.gpu, interconnect=None, p2p=None,
                      epochs=self.epochs, date=self.commit_date[:10], source=self.source,
                      hardware_source=hardware, note=self.note, repo=self.repo)


def _lines(rows: tuple, **common) -> tuple[PublishedRun, ...]:
    """A comparison's printed lines, one per (GPUs, batch, lr, sec/epoch, test acc) row."""
    return tuple(PublishedRun(n_gpus=n, batch=b, lr=lr, sec_per_epoch=t, test_acc=a, **common)
                 for n, b, lr, t, a in rows)


def _typed(text: str, kind: str):
    """One CSV cell as its field's type; in an Optional field '', 'n/a', 'not printed' is None."""
    if "Optional" in kind and text.strip() in ("", "n/a", "not printed"):
        return None
    if "bool" in kind:
        return text.strip().lower() == "true"
    return int(text) if "int" in kind else float(text) if "float" in kind else text


def _recorded(name: str, kinds: dict[str, str]) -> list[dict]:
    """The typed rows of a CSV file of `mgpu_lib/recorded`, whose header is `kinds`' columns
    (tests/test_results.py checks every cell of the shipped files)."""
    text = resources.files("mgpu_lib").joinpath("recorded", name).read_text(encoding="utf-8")
    return [{k: _typed(row[k], kinds[k]) for k in kinds}
            for row in csv.DictReader(io.StringIO(text))]


BUILD_KINDS = {f.name: str(f.type) for f in fields(Build)}
CURVE_KINDS = dict(framework="str", repo="str", commit="str", code_group="str", run="str",
                   epoch="int", test_acc_from_figure="float", printed_final_acc="float")


@functools.lru_cache(maxsize=1)
def _all_builds() -> tuple[Build, ...]:
    return tuple(Build(**row) for row in _recorded("d2l_builds.csv", BUILD_KINDS))


def builds(framework: Optional[str] = None) -> list[Build]:
    """d2l's builds of 12.6 (`recorded/d2l_builds.csv`), or those of one framework."""
    return [b for b in _all_builds() if framework in (None, b.framework)]


@functools.lru_cache(maxsize=1)
def build_curves() -> dict[tuple[str, str, int], tuple[float, ...]]:
    """Each build's test accuracy per epoch, {(repo, commit, GPUs): (epoch 1, ..., epoch 10)}.

    A reading of a plot, not printed numbers: the builds print only the last epoch, but each
    stores the Animator's final figure as SVG, whose line's vertices map through the y-axis
    ticks to accuracies to about 1e-4 (`recorded/d2l_build_curves.csv`; every decoded last
    epoch agrees with the printed accuracy to its two decimals)."""
    curves: dict = {}
    for row in _recorded("d2l_build_curves.csv", CURVE_KINDS):
        key = (row["repo"], row["commit"], int(row["run"][0]))
        curves.setdefault(key, {})[row["epoch"]] = row["test_acc_from_figure"]
    return {k: tuple(v[e] for e in sorted(v)) for k, v in curves.items()}


_NEU = dict(framework="pytorch", gpu="RTX 4090", interconnect="PCIe, staged through host memory",
           p2p=False, hardware_source=NEU_HARDWARE, repo="smolix/d2l-neu")
OTHERS: tuple[PublishedRun, ...] = (
    *_lines(((1, 256, 0.1, 5.8, 0.92), (2, 512, 0.2, 8.7, 0.87)), **_NEU,
            run="d2l-neu 28px", label="d2l-neu rebuild, 28 px (May 2026)", date="2026-05-06",
            source=D2L_NEU + "f2922b64b3bd408c40e41eaf287b6e706a045dfd/docs/"
            "convergence-audit-2026-05-06.md (the rendered page's two lines, quoted)",
            note="the chapter's code unchanged (setup: " + D2L_NEU +
            "d2e80d66fae994426bbe8e478bf3cb3f9b8ae5d2" + NEU_CONCISE + ")"),
    *(line for c, d, t1, a1, t2, a2 in (
        ("3a5fccc0d7e91f82f413021b3639fe83abf6ba72", "2026-05-29", 29.3, 0.86, 17.0, 0.88),
        ("3690b24b8ed8c28823d719e0b292f1598eab3454", "2026-07-07", 52.7, 0.89, 26.9, 0.89))
      for line in _lines(((1, 512, 0.2, t1, a1), (2, 1024, 0.4, t2, a2)), **_NEU,
                         run=f"d2l-neu 64px {d[:7]}", label=f"d2l-neu rebuild, 64 px ({d[:7]})",
                         image_size=64, date=d, source=D2L_NEU + c + "/outputs/pytorch/"
                         "chapter_computational-performance/multiple-gpus-concise.json",
                         note="images resized to 64 x 64 (about 5.2x the FLOPs per image); "
                         "setup: " + D2L_NEU + c + NEU_CONCISE)),
    *_lines(((1, 256, 0.1, 47.1, 0.90), (2, 512, 0.2, 25.6, 0.80)),
            run="study notes", label="the study notes (2025)", framework="pytorch", gpu=None,
            interconnect=None, p2p=None, date="2025-05-23", repo="study notes (reprint)",
            source="'动手学深度学习12.6. 多GPU的简洁实现-笔记练习（PyTorch）', a reprinted blog "
            "post dated 2025-05-23 (the original address is not given in the reprint)",
            note="the chapter's code unchanged; the GPU is not named"),
    # The same commit prints `nvidia-smi` twice (notebooks-2/1-use-gpu.ipynb and
    # notebooks-3/2-multiple-gpus.ipynb, both 3 July 2019): four Tesla V100-SXM2, 16130MiB.
    *_lines(((1, 256, 0.1, 13.2, 0.93), (2, 512, 0.2, 7.3, 0.92)),
            run="d2l 1-day course", label="d2l 1-day course, MXNet (2019)", framework="mxnet",
            gpu="Tesla V100-SXM2...", interconnect=None, p2p=None, date="2019-07-03",
            source=COURSE + "notebooks-3/3-multiple-gpus-gluon.ipynb",
            hardware_source=COURSE + "notebooks-2/1-use-gpu.ipynb (nvidia-smi: four "
            "Tesla V100-SXM2..., 16130MiB)", repo="d2l-ai/1day-notebooks",
            note="Gluon, not DataParallel: each GPU's forward launched from one Python "
            "loop, gradients summed by kvstore 'device'"),
)


def runs(framework: Optional[str] = None) -> list[PublishedRun]:
    """Every published line (d2l's builds, then the other sources), or those of one framework."""
    rows = [line for b in builds() for line in b.lines()] + list(OTHERS)
    return [r for r in rows if framework in (None, r.framework)]


def pairs(rows: Optional[list[PublishedRun]] = None) -> list[tuple[PublishedRun, PublishedRun]]:
    """(1-GPU row, 2-GPU row) of each comparison, in table order."""
    rows = runs() if rows is None else rows
    order = list(dict.fromkeys(r.run for r in rows))
    by = {(r.run, r.n_gpus): r for r in rows}
    return [(by[(k, 1)], by[(k, 2)]) for k in order if (k, 1) in by and (k, 2) in by]


def pair(run: str) -> tuple[PublishedRun, PublishedRun]:
    """The comparison named `run` (e.g. 'd2l-pytorch-colab f854371', 'd2l-neu 28px')."""
    return {p[0].run: p for p in pairs()}[run]


@dataclass(frozen=True)
class GpuHint:
    """One run of this repository's `tools/gpu_check.py` whose records were not kept: what its
    log printed, a hint on one device and one seed, never a verdict."""
    gpu: str
    width: int
    batch: int
    images_per_s: dict          # loop or precision -> training images/s, as bench printed them
    source: str


# Issue 51: `tools/gpu_check.py` on one NVIDIA H200 (9 of 9 stages in 387 s), 28-pixel images;
# its records were kept beside the repository and are gone, so the next GPU run regenerates them.
H200_UNSHIPPED = GpuHint(
    gpu="NVIDIA H200", width=64, batch=256,
    images_per_s={"tf32": 27914.0, "bf16": 20689.0, "compile": 22152.0},
    source="tools/gpu_check.py on one NVIDIA H200, 2026-12-04, as issue 51 quotes its log "
           "(records not kept)")
