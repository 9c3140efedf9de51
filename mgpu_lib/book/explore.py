"""Explorers: change a setting and read the library's prediction, in a notebook and in the book.

Each explorer is ipywidgets controls whose callbacks call `perf` and `split`, shown as one HTML
panel. Beside the widget it displays a view for the rendered book, where no kernel runs: the same
panel and controls, with the panel's values for every setting, for _static/explorer.js to pick
from. A notebook hides the view (`hidden`); the book shows it and never a widget (whose
JavaScript would come from a CDN)."""
from __future__ import annotations

import functools
import html
import json
import re
from typing import Callable, Optional

from mgpu_lib.perf.evidence import band, epoch_time, published_fit
from mgpu_lib.perf.published import runs
from mgpu_lib.perf.runtime import step_seconds
from mgpu_lib.perf.scaling import (DEVICES, LINKS, NO_P2P, RESNET18, DeviceSpec, LinkSpec,
                                   dp_python_s, pair_link, predict_step_time, spec_for_name)
from mgpu_lib.perf.split_time import predict_hetero_step, shard_grid
from mgpu_lib.split import split_sizes

NS = tuple(range(1, 17))
MODES = {"per GPU": (32, 64, 128, 256, 512), "global": (256, 512, 1024, 4096)}
STRATEGIES = {"DataParallel": "dp", "DDP": "ddp"}
PARTS = ("compute", "communication not hidden", "DataParallel's Python", "fixed costs")
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#7f7f7f")     # the book's matplotlib C0 to C2, gray
SPLIT_GPUS = ("T4", "V100 SXM2", "A100 SXM4 80GB", "H100 SXM5")
SLOWER = (2, 3, 10)                   # a second device this many times slower than the GPU
SYNCS = {"none": 0.0, "10 ms": 1e-2}
SYNC_CHOICES = ["the PCIe copy", *SYNCS]
BATCHES = (128, 256, 512)
CHART = (320, 150, 34)                # the curve's width, height and margin, SVG px


def _t(x: float) -> str:
    """A time as the panels print it: one decimal below 100, none above."""
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


def _e(text) -> str:
    return html.escape(str(text))


# Exercise 1: what would N GPUs do?

@functools.lru_cache(maxsize=None)
def _published(gpu: Optional[str] = None) -> tuple:
    """The published PyTorch runs on `gpu` (a `DEVICES` key), or on any named GPU."""
    return tuple(r for r in runs("pytorch") if r.gpu and spec_for_name(r.gpu)
                 and gpu in (None, spec_for_name(r.gpu).name))


def gpu_names() -> list[str]:
    """The model's datasheets, the GPUs that published runs name first."""
    named = {spec_for_name(r.gpu).name for r in _published()}
    return sorted(DEVICES, key=lambda name: name not in named)


def links(gpu: str) -> dict[str, LinkSpec]:
    """The links to choose for `gpu`: its machines' own (`pair_link`), PCIe, PCIe without P2P."""
    spec = DEVICES[gpu]
    return {link.name: link for link in (pair_link(spec), LINKS[spec.pcie], LINKS[NO_P2P])}


def _note(gpu: str, n: int, strategy: str, total: int, link: str) -> str:
    """What the prediction rests on, and the published runs of this very setting."""
    spec, mine = DEVICES[gpu], _published(gpu)
    most = max((r.n_gpus for r in mine), default=0)
    words = f"A prediction of the step-time model, {published_fit().basis(spec)}."
    if most and n > most:
        words += (f" No published run used more than {most} of these GPUs, so this is an "
                  "extrapolation the data cannot check.")
    if strategy == "DDP" and n > 1:
        words += " Every published run used DataParallel."
    same = sorted(r.sec_per_epoch for r in mine if r.n_gpus == n and r.batch == total
                  and r.image_size == 28 and link == pair_link(spec).name)
    if same and strategy == "DataParallel":
        span = _t(same[0]) if len(same) == 1 else f"{_t(same[0])} to {_t(same[-1])}"
        runs_ = "1 run" if len(same) == 1 else f"{len(same)} runs"
        words += f" Published for this setting: {span} s per epoch ({runs_})."
    return words


def gpu_values(gpu: str, n: int, strategy: str, mode: str, batch: int, link: str) -> dict:
    """The ex1 panel's values for one setting: seconds per epoch (middle, low, high of the band),
    the speed-up over one such GPU at the same batch per GPU, the step's parts in ms."""
    spec, ln, s = DEVICES[gpu], links(gpu)[link], STRATEGIES[strategy]
    total = batch * n if mode == "per GPU" else batch
    lo, mid, hi = band(epoch_time(n, total, spec, ln, s), spec)
    o = published_fit().overheads(spec)     # the band's middle
    one = epoch_time(1, total // n if mode == "per GPU" else total, spec, ln, s)(o)
    step = predict_step_time(n, total, spec, ln, s, overheads=o)
    python = dp_python_s(RESNET18, n, o) if s == "dp" else 0.0
    parts = (step.compute, step.communication, python, step.overhead - python)
    return dict(mid=_t(mid), lo=_t(lo), hi=_t(hi), speedup=f"{one / mid:.2f}",
                parts=[_t(1e3 * p) for p in parts], total=total,
                note=_note(gpu, n, strategy, total, link))


def gpu_panel(v: dict) -> str:
    """The ex1 panel as HTML, the same markup in the widget and in the book."""
    whole = sum(float(p) for p in v["parts"]) or 1.0
    bar = "".join(f'<span data-part="{i}" style="width:{100 * float(p) / whole:.1f}%;'
                  f'background:{c}"></span>' for i, (p, c) in enumerate(zip(v["parts"], COLORS)))
    legend = "".join(f'<li style="margin-right:1em"><i style="display:inline-block;width:0.7em;'
                     f'height:0.7em;margin-right:0.3em;background:{c}"></i>{_e(name)} '
                     f'<b data-k="p{i}">{p}</b> ms</li>'
                     for i, (name, p, c) in enumerate(zip(PARTS, v["parts"], COLORS)))
    return (f'<div class="mgpu-panel">'
            f'<p class="mgpu-big" aria-live="polite">Predicted: <b data-k="mid">{v["mid"]}</b> '
            f's per epoch (band <b data-k="lo">{v["lo"]}</b> to <b data-k="hi">{v["hi"]}</b> s), '
            f'<b data-k="speedup">{v["speedup"]}</b> times the speed of one such GPU; '
            f'global batch <b data-k="total">{v["total"]}</b>.</p>'
            f'<p>One step, at the middle of the band:</p>'
            f'<div class="mgpu-bar" aria-hidden="true" style="display:flex;height:14px">{bar}'
            f'</div><ul class="mgpu-legend" style="display:flex;flex-wrap:wrap;list-style:none;'
            f'padding:0;margin:0.3em 0;font-size:0.85em">{legend}</ul>'
            f'<p class="mgpu-note" data-k="note">{_e(v["note"])}</p></div>')


def gpu_grid() -> dict:
    """Every setting's panel values, for the book: grid[g][l][s][m][b][n - 1] is
    [mid, lo, hi, speed-up, four parts..., an index into `notes`] as the panel prints them."""
    names, notes = gpu_names(), {}
    grid = []
    for g in names:
        grid.append([[[[[_packed(gpu_values(g, n, s, m, b, ln), notes) for n in NS]
                        for b in MODES[m]] for m in MODES] for s in STRATEGIES]
                     for ln in links(g)])
    return dict(gpus=names, links=[list(links(g)) for g in names], strategies=list(STRATEGIES),
                modes=list(MODES), batches=list(MODES.values()), notes=list(notes), grid=grid)


def _packed(v: dict, notes: dict) -> str:
    return " ".join([v["mid"], v["lo"], v["hi"], v["speedup"], *v["parts"], str(v["total"]),
                     str(notes.setdefault(v["note"], len(notes)))])


# Exercise 2: split a batch

def split_values(gpu: str, slow: str, batch: int, sync: str, cpus: dict[str, float],
                 pcie_sync: Callable[[DeviceSpec], float]) -> dict:
    """The ex2 panel's values for one pair of devices: for each `shard_grid` share of the second
    device, each shard's time and the step's (band middle, and band); and the GPU alone."""
    spec = DEVICES[gpu]
    sync_s = pcie_sync(spec) if sync == "the PCIe copy" else SYNCS[sync]

    def speeds(o=None) -> list[float]:
        fast = batch / step_seconds(spec, batch, overheads=o)
        return [fast, cpus[slow] if slow in cpus else fast / int(slow.split()[2])]

    mid = speeds()
    best = split_sizes(batch, mid)[1]
    alone = band(lambda o: batch / speeds(o)[0], spec)
    points = []
    for n in shard_grid(batch, best):
        sizes = [batch - n, n]
        lo, step, hi = band(lambda o: predict_hetero_step(speeds(o), sizes, sync_s), spec)
        # the speedup's own band: the split against the GPU alone at the same corner (paired)
        gain = band(lambda o: batch / speeds(o)[0]
                    / predict_hetero_step(speeds(o), sizes, sync_s), spec)
        points.append(dict(share=n, fast=_t(1e3 * sizes[0] / mid[0]),
                           slow=_t(1e3 * n / mid[1]), mid=_t(1e3 * step), lo=_t(1e3 * lo),
                           hi=_t(1e3 * hi), speedup=f"{alone[1] / step:.2f}",
                           gain_lo=f"{gain[0]:.2f}", gain_hi=f"{gain[2]:.2f}",
                           raw=(step, lo, hi)))
    return dict(points=points, best=best, alone=[_t(1e3 * a) for a in alone],
                sync=_t(1e3 * sync_s), chart=_chart(points, best, slow))


def _chart(points: list, best: int, slow: str) -> dict:
    """SVG coordinates of the step time against the share: line, band, optimum's x, dots."""
    w, h, m = CHART
    xmax = max(p["share"] for p in points) or 1
    ymax = max(p["raw"][2] for p in points)
    x = lambda n: f"{m + (w - 2 * m) * n / xmax:.1f}"               # noqa: E731
    y = lambda v: f"{h - m - (h - 2 * m) * v / ymax:.1f}"            # noqa: E731
    line = " ".join(f"{x(p['share'])},{y(p['raw'][0])}" for p in points)
    upper = [f"{x(p['share'])},{y(p['raw'][2])}" for p in points]
    lower = [f"{x(p['share'])},{y(p['raw'][1])}" for p in reversed(points)]
    return dict(line=line, band=" ".join(upper + lower), best=x(best),
                dots=[[x(p["share"]), y(p["raw"][0])] for p in points],
                xmax=str(xmax), ymax=_t(1e3 * ymax), xlabel=f"images on {slow}")


def split_panel(v: dict, i: int) -> str:
    """The ex2 panel as HTML at point `i` of `split_values`: the same markup in both views."""
    p, c, (w, h, m) = v["points"][i], v["chart"], CHART
    dot = c["dots"][i]
    text = lambda k, x, y, s, a="start": (                               # noqa: E731
        f'<text data-k="{k}" x="{x}" y="{y}" font-size="11" text-anchor="{a}" '
        f'fill="currentColor">{_e(s)}</text>')
    return (f'<div class="mgpu-panel">'
            f'<p class="mgpu-big" aria-live="polite">Predicted step: <b data-k="mid">{p["mid"]}'
            f'</b> ms (band <b data-k="lo">{p["lo"]}</b> to <b data-k="hi">{p["hi"]}</b>), '
            f'against <b data-k="alone">{v["alone"][1]}</b> ms for the GPU alone: '
            f'<b data-k="speedup">{p["speedup"]}</b> times its speed (band '
            f'<b data-k="gain_lo">{p["gain_lo"]}</b> to <b data-k="gain_hi">{p["gain_hi"]}</b>'
            f', the two held at the same corner of the fit).</p>'
            f'<p>The GPU\'s shard takes <b data-k="fast">{p["fast"]}</b> ms, the second '
            f'device\'s (<b data-k="share">{p["share"]}</b> images) <b data-k="slow">'
            f'{p["slow"]}</b> ms, then the sync <b data-k="sync">{v["sync"]}</b> ms (none when '
            f'the second device gets no image). '
            f'<code>split_sizes</code> gives the second device <b data-k="best">{v["best"]}'
            f'</b>.</p>'
            f'<svg class="mgpu-chart" viewBox="0 0 {w} {h}" role="img" aria-label="Predicted '
            f'ms per step against the second device\'s images; the dashed line marks the '
            f'split that split_sizes picks.">'
            f'<polygon data-c="band" points="{c["band"]}" fill="#1f77b4" fill-opacity="0.2"/>'
            f'<polyline data-c="line" points="{c["line"]}" fill="none" stroke="#1f77b4" '
            f'stroke-width="2"/>'
            f'<line data-c="best" x1="{c["best"]}" x2="{c["best"]}" y1="{m}" y2="{h - m}" '
            f'stroke="currentColor" stroke-dasharray="4 3"/>'
            f'<circle data-c="dot" cx="{dot[0]}" cy="{dot[1]}" r="5" fill="#ff7f0e"/>'
            f'<polyline points="{m},{m} {m},{h - m} {w - m},{h - m}" fill="none" '
            f'stroke="currentColor"/>'
            + text("x0", m, h - m + 14, "0") + text("xmax", w - m, h - m + 14, c["xmax"], "end")
            + text("xlabel", w / 2, h - 4, c["xlabel"], "middle")
            + text("ymax", m - 4, m + 4, c["ymax"], "end")
            + text("ylabel", m + 4, m - 8, "ms per step") + '</svg></div>')


def split_grid(cpus: dict[str, float], pcie_sync: Callable[[DeviceSpec], float]) -> dict:
    """Every setting's panel values, for the book: grid[g][s][b][y] is the record of
    `split_values` with each point packed as the panel prints it."""
    slows = [*cpus, *(f"a device {k} times slower" for k in SLOWER)]
    grid = [[[[_split_packed(split_values(g, s, b, y, cpus, pcie_sync)) for y in SYNC_CHOICES]
              for b in BATCHES] for s in slows] for g in SPLIT_GPUS]
    return dict(gpus=list(SPLIT_GPUS), slows=slows, batches=list(BATCHES),
                syncs=list(SYNC_CHOICES), grid=grid)


def _split_packed(v: dict) -> dict:
    c = v["chart"]
    return dict(best=v["best"], alone=v["alone"][1], sync=v["sync"],
                i=next(i for i, p in enumerate(v["points"]) if p["share"] == v["best"]),
                p=[" ".join([str(p["share"]), p["mid"], p["lo"], p["hi"], p["fast"], p["slow"],
                             p["speedup"], p["gain_lo"], p["gain_hi"]])
                   for p in v["points"]],
                line=c["line"], band=c["band"], x=c["best"], xmax=c["xmax"], ymax=c["ymax"],
                xlabel=c["xlabel"])


# The views: a widget in a kernel, HTML in the book

class Explorer:
    """Controls, the panel they drive, and the book's view (hidden outside the book)."""

    def __init__(self, controls: dict, panel, view: str):
        self.controls, self.panel, self.view = controls, panel, view

    def shown(self, key: str) -> str:
        """The text the panel shows under `key` (`data-k`), as a reader reads it."""
        found = re.search(rf'data-k="{key}"[^>]*>([^<]*)<', self.panel.value)
        return html.unescape(found.group(1)) if found else ""

    def _ipython_display_(self) -> None:
        from IPython.display import display
        import ipywidgets as w
        for control in self.controls.values():
            control.style.description_width = "initial"     # labels in full, not cut
        box = w.VBox([w.HBox(list(self.controls.values()),
                             layout=w.Layout(flex_flow="row wrap")), self.panel])
        bundle = box._repr_mimebundle_()
        bundle.pop("text/plain", None)      # a frontend without widgets shows the view instead
        display(bundle, raw=True)
        display({"text/html": self.view, "text/plain": ""}, raw=True)


def _view(name: str, title: str, controls: str, panel: str, data: dict) -> str:
    """The book's view: a form of labelled controls, the panel, and the grid as JSON."""
    grid = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    return (f'<div class="mgpu-explorer" data-explorer="{name}" hidden>'
            f'<p class="mgpu-title">{_e(title)}</p>'
            f'<form class="mgpu-controls" aria-label="{_e(title)}">{controls}</form>{panel}'
            f'<script type="application/json" class="mgpu-data">{grid}</script></div>')


def _select(name: str, label: str, options, value) -> str:
    opts = "".join(f'<option value="{i}"{" selected" if o == value else ""}>{_e(o)}</option>'
                   for i, o in enumerate(options))
    return (f'<label class="mgpu-field"><span>{_e(label)}</span>'
            f'<select name="{name}">{opts}</select></label>')


def _radios(name: str, label: str, options, value) -> str:
    items = "".join(f'<label><input type="radio" name="{name}" value="{i}"'
                    f'{" checked" if o == value else ""}> {_e(o)}</label>'
                    for i, o in enumerate(options))
    return f'<fieldset class="mgpu-field"><legend>{_e(label)}</legend>{items}</fieldset>'


def _range(name: str, label: str, count: int, index: int, text: str) -> str:
    return (f'<label class="mgpu-field"><span>{_e(label)}: <output>{_e(text)}</output></span>'
            f'<input type="range" name="{name}" min="0" max="{count - 1}" value="{index}" '
            f'aria-valuetext="{_e(text)}"></label>')


GPUS_TITLE = "What would N GPUs do? The step-time model's prediction, with its band"
SPLIT_TITLE = "Split a batch: a GPU and a slower device, predicted"
GPUS_DEFAULT_N = 2     # at 1 GPU the strategy, the batch's meaning and the link change nothing


def gpus_explorer() -> Explorer:
    """Exercise 1's explorer; each change calls `gpu_values` (the model's band and parts). It
    opens on K80 dies at 2 GPUs, where every control changes the prediction."""
    import ipywidgets as w
    gpu, n, strategy, mode, batch = ("K80 (one GK210 die)", GPUS_DEFAULT_N, "DataParallel",
                                     "per GPU", 256)
    link = next(iter(links(gpu)))
    c = dict(gpu=w.Dropdown(options=gpu_names(), value=gpu, description="GPU"),
             n=w.IntSlider(value=n, min=1, max=16, description="GPUs"),
             strategy=w.ToggleButtons(options=list(STRATEGIES), value=strategy,
                                      description="Strategy"),
             mode=w.RadioButtons(options=list(MODES), value=mode, description="Batch is"),
             batch=w.Dropdown(options=MODES[mode], value=batch, description="Batch"),
             link=w.Dropdown(options=list(links(gpu)), value=link, description="Link"))
    panel = w.HTML(gpu_panel(gpu_values(gpu, n, strategy, mode, batch, link)))

    def update(change=None) -> None:
        if change and change["owner"] is c["gpu"]:
            c["link"].options = list(links(c["gpu"].value))
        if change and change["owner"] is c["mode"]:
            c["batch"].options = MODES[c["mode"].value]
        panel.value = gpu_panel(gpu_values(*(c[k].value for k in
                                             ("gpu", "n", "strategy", "mode", "batch", "link"))))

    for control in c.values():
        control.observe(update, names="value")
    controls = (_select("gpu", "GPU", gpu_names(), gpu)
                + _range("n", "GPUs", len(NS), n - 1, str(n))
                + _radios("strategy", "Strategy", STRATEGIES, strategy)
                + _radios("mode", "Batch is", MODES, mode)
                + _select("batch", "Batch", MODES[mode], batch)
                + _select("link", "Link", links(gpu), link))
    return Explorer(c, panel, _view("gpus", GPUS_TITLE, controls, panel.value, gpu_grid()))


def split_explorer(cpus: dict[str, float], pcie_sync: Callable[[DeviceSpec], float]) -> Explorer:
    """Exercise 2's explorer, opening on a V100 and the first of `cpus` (name -> images/s);
    each change calls `split_values`. `pcie_sync(spec)`: the sync's seconds over the GPU's PCIe
    link."""
    import ipywidgets as w
    slows = [*cpus, *(f"a device {k} times slower" for k in SLOWER)]
    gpu, batch, slow, sync = "V100 SXM2", 256, slows[0], SYNC_CHOICES[0]
    values = split_values(gpu, slow, batch, sync, cpus, pcie_sync)
    shares = [p["share"] for p in values["points"]]
    c = dict(gpu=w.Dropdown(options=SPLIT_GPUS, value=gpu, description="GPU"),
             slow=w.Dropdown(options=slows, value=slow, description="Second device"),
             batch=w.Dropdown(options=BATCHES, value=batch, description="Batch"),
             sync=w.Dropdown(options=SYNC_CHOICES, value=sync, description="Sync"),
             share=w.SelectionSlider(options=shares, value=values["best"],
                                     description="Its images"))
    state, best = dict(values=values), shares.index(values["best"])
    panel = w.HTML(split_panel(values, best))

    def update(change) -> None:
        if change["owner"] is not c["share"]:
            v = split_values(*(c[k].value for k in ("gpu", "slow", "batch", "sync")), cpus,
                             pcie_sync)
            state["values"] = v
            c["share"].options = [p["share"] for p in v["points"]]   # calls back: share 0
            c["share"].value = v["best"]
            return
        v = state["values"]
        panel.value = split_panel(v, [p["share"] for p in v["points"]].index(c["share"].value))

    for control in c.values():
        control.observe(update, names="value")
    controls = (_select("gpu", "GPU", SPLIT_GPUS, gpu)
                + _select("slow", "Second device", slows, slow)
                + _select("batch", "Batch", BATCHES, batch)
                + _select("sync", "Sync", SYNC_CHOICES, sync)
                + _range("share", "Second device's share", len(shares), best,
                         f"{values['best']} images"))
    return Explorer(c, panel, _view("split", SPLIT_TITLE, controls, panel.value,
                                    split_grid(cpus, pcie_sync)))
