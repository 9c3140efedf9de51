"""The explorers (mgpu_lib/book/explore.py) driven from Python, as a reader's clicks drive them:
set a control's value, read what the panel shows, and check it against the library's own call
for that setting. The book's view of the same explorers is driven in Chromium by
tests/test_layout.py."""
from __future__ import annotations

import json
import re
import time

import pytest

pytest.importorskip("ipywidgets")

from mgpu_lib.book.explore import gpus_explorer, gpu_values, links, split_explorer  # noqa: E402
from mgpu_lib.perf.evidence import band, epoch_time, workload  # noqa: E402
from mgpu_lib.perf.runtime import step_seconds  # noqa: E402
from mgpu_lib.perf.scaling import DEVICES, LINKS, pair_link  # noqa: E402
from mgpu_lib.perf.split_time import predict_hetero_step  # noqa: E402
from mgpu_lib.split import split_sizes  # noqa: E402

K80 = DEVICES["K80 (one GK210 die)"]
CPUS = {"the slower recorded CPU": 60.0, "the faster recorded CPU": 110.0}


def pcie_sync_s(spec):
    """ex2's sync: gradients in and weights out over the GPU's PCIe link."""
    w = workload(64)
    return 2 * w.bytes_per_param * w.params / (LINKS[spec.pcie].gbs * 1e9)


@pytest.fixture(scope="module")
def gpus():
    return gpus_explorer()


@pytest.fixture(scope="module")
def split():
    return split_explorer(CPUS, pcie_sync_s)


def seconds(x: float) -> str:
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


def test_gpus_widget_shows_the_models_band(gpus):
    c = gpus.controls
    assert (c["gpu"].value, c["n"].value, c["strategy"].value) == (K80.name, 2, "DataParallel")
    for n, strategy, mode, batch in ((16, "DataParallel", "per GPU", 256),
                                     (16, "DDP", "global", 256), (8, "DDP", "per GPU", 64)):
        started = time.perf_counter()
        c["strategy"].value, c["mode"].value = strategy, mode
        c["batch"].value, c["n"].value = batch, n
        assert time.perf_counter() - started < 0.1     # four updates, each well under 100 ms
        total = batch * n if mode == "per GPU" else batch
        lo, mid, hi = band(epoch_time(n, total, K80, pair_link(K80),
                                      {"DataParallel": "dp", "DDP": "ddp"}[strategy]), K80)
        assert [gpus.shown(k) for k in ("mid", "lo", "hi", "total")] == [
            seconds(mid), seconds(lo), seconds(hi), str(total)]


def test_gpus_widget_follows_the_gpu_and_its_links(gpus):
    c = gpus.controls
    c["gpu"].value = "V100 SXM2"
    assert list(c["link"].options)[0] == pair_link(DEVICES["V100 SXM2"]).name
    c["strategy"].value, c["mode"].value, c["batch"].value, c["n"].value = (
        "DataParallel", "per GPU", 256, 2)
    assert "Published for this setting" in gpus.shown("note")
    c["link"].value = LINKS["PCIe gen3 x16"].name
    spec = DEVICES["V100 SXM2"]
    mid = band(epoch_time(2, 512, spec, LINKS["PCIe gen3 x16"], "dp"), spec)[1]
    assert gpus.shown("mid") == seconds(mid)
    assert "Published" not in gpus.shown("note")   # d2l's builds ran on NVLink


def test_gpus_explorer_opens_where_every_control_matters():
    """ex1 opens at 2 GPUs: there the strategy, what the batch counts and the link each change
    the prediction (at 1 GPU they change nothing), and the book's view opens at the same
    setting, showing the widget's panel."""
    fresh = gpus_explorer()
    c = fresh.controls
    assert c["n"].value == 2
    setting = {k: c[k].value for k in ("gpu", "n", "strategy", "mode", "batch", "link")}
    others = {"strategy": "DDP", "mode": "global", "link": list(links(setting["gpu"]))[-1]}
    for n, differs in ((1, False), (2, True)):
        base = gpu_values(**{**setting, "n": n})
        for key, value in others.items():
            moved = gpu_values(**{**setting, "n": n, key: value})
            assert (moved["mid"] != base["mid"]) is differs, (n, key)
    view = fresh.view
    assert 'name="n" min="0" max="15" value="1"' in view     # the range's index: 2 GPUs
    assert "<output>2</output>" in view
    assert fresh.panel.value in view                          # the same panel, word for word


def test_split_widget_shows_the_split_arithmetic(split):
    c = split.controls
    c["slow"].value = "a device 3 times slower"
    spec, batch, sync = DEVICES["V100 SXM2"], 256, pcie_sync_s(DEVICES["V100 SXM2"])
    fast = batch / step_seconds(spec, batch)
    best = split_sizes(batch, [fast, fast / 3])[1]
    assert c["share"].value == best and split.shown("best") == str(best)
    for share in (0, c["share"].options[-1], best):
        started = time.perf_counter()
        c["share"].value = share
        assert time.perf_counter() - started < 0.1
        step = predict_hetero_step([fast, fast / 3], [batch - share, share], sync)
        assert split.shown("mid") == seconds(1e3 * step)
        assert split.shown("share") == str(share)
    c["gpu"].value, c["slow"].value = "H100 SXM5", "the slower recorded CPU"
    assert split.shown("best") == "0"             # one image on the CPU outlasts the H100's batch
    assert split.shown("mid") == split.shown("alone")


def test_views_are_the_widgets_numbers_and_load_nothing(gpus, split):
    for explorer in (gpus, split):
        view = explorer.view
        assert view.startswith('<div class="mgpu-explorer"') and " hidden>" in view[:80]
        assert not re.search(r"(src|href)=|https?:", view)
        data = json.loads(re.search(r'class="mgpu-data">(.*)</script>', view).group(1))
        assert data["grid"]
    fresh = gpus_explorer()
    grid = json.loads(re.search(r'class="mgpu-data">(.*)</script>', fresh.view).group(1))
    fresh.controls["n"].value = 16
    entry = grid["grid"][grid["gpus"].index(K80.name)][0][0][0][3][15].split()
    assert entry[:3] == [fresh.shown(k) for k in ("mid", "lo", "hi")]


def test_every_control_is_labelled(gpus, split):
    for explorer in (gpus, split):
        form = re.search(r"<form.*?</form>", explorer.view).group(0)
        controls = len(re.findall(r"<select|<input type=\"range\"", form))
        labelled = len(re.findall(r"<label class=\"mgpu-field\"><span>[^<]+", form))
        assert controls == labelled
        assert all(w.description for w in explorer.controls.values())


def test_display_is_a_widget_and_the_books_view(gpus, monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, raw=False: shown.append(obj))
    gpus._ipython_display_()
    assert list(shown[0]) == ["application/vnd.jupyter.widget-view+json"]
    assert shown[1]["text/html"] == gpus.view
