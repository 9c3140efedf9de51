"""The model against the published runs: the fit recovers what made the data, every held-out
figure is predicted by a fit that never saw it, and bands decide only what they can."""
import re
from dataclasses import replace

import pytest

from mgpu_lib.perf import evidence, published
from mgpu_lib.perf.published import PublishedRun
from mgpu_lib.perf.scaling import DEVICES, Overheads

V100, G4090, K80 = DEVICES["V100 SXM2"], DEVICES["RTX 4090"], DEVICES["K80 (one GK210 die)"]
V100_NAME = "Tesla V100-SXM2-16GB"


def _synthetic(efficiency: dict, thread_s: dict) -> list[PublishedRun]:
    """Rows whose figures the model itself made, at known efficiency and thread_s per GPU
    (two runs per GPU: a held-out 1-GPU line is predicted from its GPU's other run)."""
    rows = []
    for gpu, p2p, size in ((V100_NAME, None, 28), (V100_NAME, None, 64),
                           ("RTX 4090", False, 28), ("RTX 4090", False, 64)):
        for n, b in ((1, 256), (2, 512)):
            r = PublishedRun(run=f"{gpu} {size}", label="t", framework="pytorch", n_gpus=n,
                             batch=b, lr=0.1, sec_per_epoch=1.0, test_acc=None, gpu=gpu,
                             interconnect=None, p2p=p2p, image_size=size, repo=gpu)
            spec = V100 if "V100" in gpu else G4090
            o = Overheads(efficiency=efficiency[spec.name], thread_s=thread_s[spec.name])
            rows.append(replace(r, sec_per_epoch=evidence.row_seconds(
                r, spec, evidence.link_for(r), o)))
    return rows


def test_fit_recovers_each_gpu_class_on_its_own():
    """Before: DataParallel's Python was one pooled figure over every GPU class."""
    rows = _synthetic({"V100 SXM2": 0.7, "RTX 4090": 0.3}, {"V100 SXM2": 4e-3, "RTX 4090": 1e-3})
    f = evidence.fit(rows)
    assert f.efficiency["V100 SXM2"] == pytest.approx((0.7, 0.7, 0.7), rel=1e-4)
    assert f.efficiency["RTX 4090"] == pytest.approx((0.3, 0.3, 0.3), rel=1e-4)
    assert f.thread_s["V100 SXM2"] == pytest.approx((4e-3,) * 3, rel=1e-3)
    assert f.thread_s["RTX 4090"] == pytest.approx((1e-3,) * 3, rel=1e-3)
    assert all(abs(h["error"]) < 1e-3 for h in evidence.held_out(rows))


def test_a_class_clamped_at_zero_does_not_pull_another_down():
    """The RTX 4090 rows can only be fitted with thread_s clamped at 0; pooled, that halved
    the V100's figure and every V100 2-GPU prediction came out too fast."""
    rows = _synthetic({"V100 SXM2": 0.7, "RTX 4090": 0.3}, {"V100 SXM2": 5e-3, "RTX 4090": 0.0})
    rows = [replace(r, sec_per_epoch=r.sec_per_epoch * 0.9) if "4090" in r.run and r.n_gpus == 2
            else r for r in rows]                      # faster than any thread_s >= 0 explains
    f = evidence.fit(rows)
    assert f.thread_s["RTX 4090"][2] < 1e-9
    assert f.thread_s["V100 SXM2"] == pytest.approx((5e-3,) * 3, rel=1e-3)


def test_held_out_errors_show_a_figure_the_others_disagree_with():
    rows = _synthetic({"V100 SXM2": 0.7, "RTX 4090": 0.3}, {"V100 SXM2": 4e-3, "RTX 4090": 4e-3})
    rows[5] = replace(rows[5], sec_per_epoch=rows[5].sec_per_epoch * 1.5)  # 4090 28 px, 2 GPUs
    errors = {(h["run"], h["n_gpus"]): h["error"] for h in evidence.held_out(rows)}
    assert errors[("RTX 4090 28", 2)] < -0.2          # predicted well below the inflated figure
    assert evidence.fit(rows).thread_s["RTX 4090"][2] > 4e-3     # and the band widens to hold it


def test_every_v100_build_held_out_is_within_10_percent_given_its_own_one_gpu_line():
    """Issue 30: fitted on 3 of 49 builds with a pooled DataParallel cost, 18 of 46 2-GPU
    lines missed by more than 11%, all too fast. Each build left out in turn here."""
    rows = evidence.conditioned_errors("V100 SXM2")
    assert len(rows) == len(published.builds("pytorch")) >= 40
    assert max(abs(r["error"]) for r in rows) < 0.10, rows
    assert all(r["low_s"] <= r["predicted_s"] <= r["high_s"] for r in rows)
    assert {r["repo"] for r in rows} == {b.repo for b in published.builds("pytorch")}


def test_each_source_held_out_whole_is_predicted_by_the_others():
    rows = evidence.held_out_sources()
    assert len(rows) == len(evidence.held_out())                 # every PyTorch line once
    repos = {r["repo"] for r in rows}
    assert {"d2l-ai/d2l-pytorch-colab", "d2l-ai/d2l-zh-pytorch-colab", "smolix/d2l-neu"} <= repos
    for repo in ("d2l-ai/d2l-pytorch-colab", "d2l-ai/d2l-zh-pytorch-colab"):
        two = [r for r in rows if r["repo"] == repo and r["n_gpus"] == 2]
        assert max(abs(r["error"]) for r in two) < 0.10          # the other repository's fit
    # d2l-neu is the only RTX 4090 source: held out, its GPU is lent the V100's band
    neu = [r for r in rows if r["repo"] == "smolix/d2l-neu" and r["n_gpus"] == 1]
    assert not any(r["inside"] for r in neu)


def test_every_published_direction_with_named_hardware_is_reproduced():
    rows = evidence.directions()
    assert {r["run"] for r in rows} >= {"d2l-pytorch-colab f854371", "d2l-neu 28px"}
    assert all(r["agree"] for r in rows), [r for r in rows if not r["agree"]]
    neu = next(r for r in rows if r["run"] == "d2l-neu 28px")
    assert neu["published"] < 1 and neu["predicted"] < 1       # DataParallel slower on 2 4090s


def test_held_out_covers_every_pytorch_line_that_names_its_gpu():
    named = [r for r in published.runs("pytorch") if r.gpu]
    assert len(evidence.held_out()) == len(named)
    assert all(h["predicted_s"] > 0 for h in evidence.held_out())


def test_predicted_faster_holds_two_predictions_of_one_fit_at_the_same_corners():
    """Issue 36: compared as independent bands, A was undecided where A < B at every corner of
    the fit (the two bands move together); now a side wins only where it wins at every corner,
    and where the corners disagree the answer stays undecided."""
    f = evidence.Fit({"V100 SXM2": (0.5, 0.6, 0.7)}, {"V100 SXM2": (0.0, 0.01, 0.05)},
                     Overheads(), {})
    a, b = (lambda o: 1 + o.thread_s * 10), (lambda o: 1 + o.thread_s * 10 + 0.01)
    assert evidence.band(a, V100, f)[2] > evidence.band(b, V100, f)[0]     # bands overlap
    assert evidence.predicted_faster(a, b, V100, ("A", "B"), f) == "A faster"
    assert evidence.predicted_faster(b, a, V100, ("B", "A"), f) == "A faster"
    crossing = lambda o: 1 + o.thread_s * 10            # 1.0 at thread_s 0, 1.5 at 0.05
    assert evidence.predicted_faster(crossing, lambda o: 1.2, V100, ("A", "B"), f) == \
        evidence.UNDECIDED
    assert evidence.predicted_faster(lambda o: 1.0, lambda o: 1.0, V100, ("A", "B"), f) == \
        evidence.UNDECIDED
    # the gaps it reads: the 4 corners (thread_s 0 and 0.05 at each efficiency), the middle
    assert evidence.corner_gaps(crossing, lambda o: 1.2, V100, f) == pytest.approx(
        [-0.2, 0.3, -0.2, 0.3, -0.1])
    lo, mid, hi = evidence.band(lambda o: 1 + o.thread_s / o.efficiency, V100, f)
    assert lo == 1.0 and mid == pytest.approx(1 + 0.01 / 0.6) and hi == pytest.approx(1.1)


def test_ddp_beats_dataparallel_on_two_v100s_at_batch_512():
    """Issue 36: the marginal bands called this 'cannot be told'; DDP is faster at every
    corner of the fit."""
    two = lambda s: evidence.epoch_time(2, 512, V100, strategy=s)
    f = evidence.published_fit()
    assert all(two("ddp")(o) < two("dp")(o) for o in
               (f.overheads(V100, c, t) for c, t in evidence.CORNERS))
    assert evidence.predicted_faster(two("ddp"), two("dp"), V100,
                                     ("DDP", "DataParallel")) == "DDP faster"


def test_two_rtx_4090s_are_called_slower_than_one():
    two, one = evidence.epoch_time(2, 512, G4090), evidence.epoch_time(1, 256, G4090)
    assert evidence.predicted_faster(two, one, G4090, ("two GPUs", "one GPU")) == "one GPU faster"


def test_a_gpu_no_run_names_gets_every_fitted_range_and_says_it_is_wide():
    f = evidence.Fit({"V100 SXM2": (0.7, 0.8, 0.9), "RTX 4090": (0.2, 0.3, 0.4)},
                     {"V100 SXM2": (1e-3, 2e-3, 3e-3), "RTX 4090": (0.0, 0.0, 0.0)},
                     Overheads(), {}, {"V100 SXM2": 5, "RTX 4090": 3})
    lo, _, hi = f.efficiency_of(K80)
    assert (lo, hi) == (0.2, 0.9) and f.lent(K80) and not f.lent(V100)
    assert "no published run" in f.basis(K80) and "wide" in f.basis(K80)
    assert f.basis(V100) == "fitted to 5 published V100 SXM2 runs"
    assert f.thread_of(K80) == (0.0, pytest.approx(1e-3), 3e-3)


def test_a_tf32_gpu_borrows_efficiency_only_from_tf32_fitted_runs():
    """Issue 36: the V100's FP32-core efficiency (0.71 to 0.95) was pooled into the A100's
    band, so its middle implied tensor cores far better used than the one TF32 GPU fitted."""
    f = evidence.published_fit()
    a100 = DEVICES["A100 SXM4 80GB"]
    assert f.efficiency_of(a100) == f.efficiency["RTX 4090"]
    assert "TF32 GPU, RTX 4090" in f.basis(a100) and "wide" in f.basis(a100)
    mid = {s.name: evidence.band(evidence.epoch_time(1, 256, s), s)[1] for s in (a100, V100)}
    assert mid["V100 SXM2"] / mid[a100.name] <= 4        # one A100 at most 4 V100s


def test_a_constant_ratio_does_about_as_well_as_the_model_on_the_v100_builds():
    """Issue 36: beside leave-one-build-out, the baseline 'the other builds' mean ratio times
    this build's 1-GPU time': the V100 data identify one ratio, not the model's parts."""
    model, ratio = evidence.conditioned_errors("V100 SXM2"), evidence.ratio_errors("V100 SXM2")
    assert [r["run"] for r in ratio] == [r["run"] for r in model]
    worst = {k: max(abs(r["error"]) for r in rows) for k, rows in
             (("model", model), ("ratio", ratio))}
    assert worst["ratio"] == pytest.approx(0.080, abs=0.005)
    assert worst["model"] == pytest.approx(0.086, abs=0.005)
    one = ratio[0]
    others = [t.sec_per_epoch / o.sec_per_epoch for o, t in published.pairs()
              if o.run != one["run"] and o.gpu and "V100" in o.gpu and o.framework == "pytorch"]
    assert one["ratio"] == pytest.approx(sum(others) / len(others))


def test_the_builds_file_holds_d2ls_builds_each_with_its_commit():
    """Issue 30: at least 40 PyTorch and 40 MXNet builds, each with repository and commit,
    and the CSV the one source of d2l's builds (no hand-typed d2l-en rows beside it)."""
    for framework in ("pytorch", "mxnet"):
        rows = published.builds(framework)
        assert len(rows) >= 40
        for b in rows:
            assert re.fullmatch(r"[0-9a-f]{40}", b.commit) and b.repo.startswith("d2l-ai/")
            assert b.source == (f"https://github.com/{b.repo}/blob/{b.commit}/"
                                f"{b.notebook_path}")
            assert isinstance(b.sec_per_epoch_1, float) and isinstance(b.batch_2, int)
    colab = [r for r in published.runs() if r.repo.startswith("d2l-ai/d2l-")]
    assert len(colab) == 2 * len(published.builds())
    assert published.pair("d2l-pytorch-colab f854371")[0].sec_per_epoch == 12.2


def test_every_build_has_both_curves_and_each_ends_where_its_printed_line_does():
    curves = published.build_curves()
    for b in published.builds():
        for gpus, printed in ((1, b.test_acc_1), (2, b.test_acc_2)):
            curve = curves[(b.repo, b.commit, gpus)]
            assert len(curve) == b.epochs
            assert abs(curve[-1] - printed) <= 0.005 + 1e-9      # printed to two decimals
    assert len(curves) == 2 * len(published.builds())


def test_published_rows_say_where_they_come_from_and_guess_nothing():
    for r in published.runs():
        assert r.source and r.repo
        if r.run != "study notes":             # a reprint that gives no address
            assert r.source.startswith("https://github.com/")
        if r.gpu is None:
            assert r.interconnect is None and r.p2p is None and r.hardware_source is None
    speedup = {one.run: one.sec_per_epoch / two.sec_per_epoch for one, two in published.pairs()}
    assert speedup["d2l-neu 28px"] < 1 < speedup["study notes"]
    with pytest.raises(KeyError):
        published.pair("nope")


def test_the_one_day_course_names_its_gpus():
    """Before: 'the GPU is not named'; the same commit prints nvidia-smi with 4 V100-SXM2."""
    one, two = published.pair("d2l 1-day course")
    assert "V100-SXM2" in one.gpu and "1-use-gpu.ipynb" in one.hardware_source
    assert one.framework == "mxnet" and one.run not in {h["run"] for h in evidence.held_out()}


