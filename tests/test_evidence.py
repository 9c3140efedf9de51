"""The model against the published runs: the fit recovers what made the data, every held-out
figure is predicted by a fit that never saw it, and bands decide only what they can."""
from dataclasses import replace

import pytest

from mgpu_lib.perf import evidence, published
from mgpu_lib.perf.published import PublishedRun
from mgpu_lib.perf.scaling import DEVICES, Overheads

V100, G4090 = DEVICES["V100 SXM2"], DEVICES["RTX 4090"]


def _synthetic(mfu: dict, thread_s: float) -> list[PublishedRun]:
    """Rows whose figures the model itself made, at known mfu and thread_s (two runs per GPU:
    a held-out 1-GPU line is predicted from its GPU's other run)."""
    rows = []
    for gpu, p2p, size in (("Tesla V100-SXM2-16GB", None, 28), ("Tesla V100-SXM2-16GB", None, 64),
                           ("RTX 4090", False, 28), ("RTX 4090", False, 64)):
        for n, b in ((1, 256), (2, 512)):
            r = PublishedRun(run=f"{gpu} {size}", label="t", framework="pytorch", n_gpus=n,
                             batch=b, lr=0.1, sec_per_epoch=1.0, test_acc=None, gpu=gpu,
                             interconnect=None, p2p=p2p, image_size=size)
            spec = DEVICES["V100 SXM2"] if "V100" in gpu else G4090
            o = Overheads(mfu=mfu[spec.name], thread_s=thread_s)
            rows.append(replace(r, sec_per_epoch=evidence.row_seconds(
                r, spec, evidence.link_for(r), o)))
    return rows


def test_fit_recovers_the_overheads_that_made_the_figures():
    rows = _synthetic({"V100 SXM2": 0.7, "RTX 4090": 0.3}, 4e-3)
    f = evidence.fit(rows)
    assert f.mfu["V100 SXM2"] == pytest.approx((0.7, 0.7, 0.7), rel=1e-4)
    assert f.mfu["RTX 4090"] == pytest.approx((0.3, 0.3, 0.3), rel=1e-4)
    assert f.thread_s == pytest.approx((4e-3, 4e-3, 4e-3), rel=1e-3)
    assert all(abs(h["error"]) < 1e-3 for h in evidence.held_out(rows))


def test_held_out_errors_show_a_figure_the_others_disagree_with():
    rows = _synthetic({"V100 SXM2": 0.7, "RTX 4090": 0.3}, 4e-3)
    rows[5] = replace(rows[5], sec_per_epoch=rows[5].sec_per_epoch * 1.5)  # 4090 28 px, 2 GPUs
    errors = {(h["run"], h["n_gpus"]): h["error"] for h in evidence.held_out(rows)}
    assert errors[("RTX 4090 28", 2)] < -0.2          # predicted well below the inflated figure
    assert evidence.fit(rows).thread_s[2] > 4e-3      # and the band widens to hold it


def test_every_published_direction_with_named_hardware_is_reproduced():
    rows = evidence.directions()
    assert {r["run"] for r in rows} >= {"d2l-en 2023-08", "d2l-neu 28px"}
    assert all(r["agree"] for r in rows), rows
    neu = next(r for r in rows if r["run"] == "d2l-neu 28px")
    assert neu["published"] < 1 and neu["predicted"] < 1       # DataParallel slower on 2 4090s


def test_held_out_covers_every_line_that_names_its_gpu():
    named = [r for r in published.runs() if r.gpu]
    assert len(evidence.held_out()) == len(named)
    assert all(h["predicted_s"] > 0 for h in evidence.held_out())


def test_runs_without_hardware_are_ranges_not_fits():
    out = {u["run"]: u for u in evidence.unknown_hardware()}
    assert set(out) == {p[0].run for p in published.pairs() if p[0].gpu is None}
    for u in out.values():
        assert u["one_gpu"][0] < u["one_gpu"][1] and u["two_gpus"][0] < u["two_gpus"][1]
        assert set(u["consistent"]) <= set(DEVICES)
    newer = {n for n, s in DEVICES.items() if s.released > 2019}   # after d2l's 2019 course
    assert not newer & set(out["d2l 1-day course"]["consistent"])
    assert out["d2l 1-day course"]["one_gpu"][0] > out["study notes"]["one_gpu"][0]


def test_a_verdict_that_flips_inside_the_band_is_undecided():
    f = evidence.Fit({"V100 SXM2": (0.5, 0.6, 0.7)}, (0.0, 0.01, 0.05), Overheads(), {})
    flips = evidence.compare(lambda o: o.thread_s * 10, lambda o: 0.1, V100, ("A", "B"), f)
    assert flips == evidence.UNDECIDED
    assert evidence.compare(lambda o: o.thread_s, lambda o: 1.0, V100, ("A", "B"), f) == "A faster"
    assert evidence.compare(lambda o: 1.0, lambda o: o.thread_s, V100, ("A", "B"), f) == "B faster"
    tie = evidence.compare(lambda o: 1.0, lambda o: 1.0, V100, ("A", "B"), f)
    assert tie == evidence.UNDECIDED                   # a tie is no one's win
    lo, mid, hi = evidence.band(lambda o: o.thread_s / o.mfu, V100, f)
    assert lo == 0.0 and mid == pytest.approx(0.01 / 0.6) and hi == pytest.approx(0.05 / 0.5)


def test_a_gpu_no_run_names_gets_the_range_of_every_fitted_gpu():
    f = evidence.Fit({"V100 SXM2": (0.7, 0.8, 0.9), "RTX 4090": (0.2, 0.3, 0.4)},
                     (0.0, 0.0, 0.0), Overheads(), {})
    lo, _, hi = f.mfu_of(DEVICES["K80 (one GK210 die)"])
    assert (lo, hi) == (0.2, 0.9)


def test_published_rows_say_where_they_come_from_and_guess_nothing():
    for r in published.runs():
        assert r.source
        if r.run != "study notes":             # a reprint that gives no address
            assert r.source.startswith("https://github.com/")
        if r.gpu is None:
            assert r.interconnect is None and r.p2p is None and r.hardware_source is None
    assert published.pair("d2l-en 2023-08")[0].sec_per_epoch == 12.2
    assert published.speedup("d2l-neu 28px") < 1 < published.speedup("study notes")
    with pytest.raises(KeyError):
        published.pair("nope")


def test_check_on_runs_predicts_each_batch_without_seeing_it():
    from types import SimpleNamespace
    from mgpu_lib.perf.evidence import check_on_runs
    from mgpu_lib.perf.scaling import GLOO_LOOPBACK, RESNET18

    def run(batch, status="ok"):           # 0.01 s a step plus 1 ms an image: a straight line
        steps = 6000 // batch
        return SimpleNamespace(status=status, config={"batch_size": batch}, steps_per_epoch=steps,
                               sec_per_epoch=steps * (0.01 + 0.001 * batch))
    records = [run(64), run(128), run(256), run(512, status="diverged")]
    cal, rows = check_on_runs(records, [], RESNET18, 6000, 2, GLOO_LOOPBACK)
    assert [name for name, _, _ in rows] == [f"1 process, batch {b}" for b in (64, 128, 256)]
    assert abs(cal.step_s - 0.01) < 1e-9 and abs(cal.images_per_second - 1000) < 1e-6
    for _, measured, predicted in rows:   # a line is predicted exactly by the other points
        assert predicted == pytest.approx(measured, rel=1e-9)


def test_half_speed_batch_interpolates_in_log2_of_the_batch():
    rows = [dict(batch=b, images_per_second=r) for b, r in ((8, 100), (16, 300), (32, 400))]
    # half of 400 is 200: halfway from 100 (batch 2**3) to 300 (2**4) in images/s
    assert evidence.half_speed_batch(rows) == pytest.approx(2 ** 3.5)
    rows[0]["images_per_second"] = 250              # the smallest batch already beats half
    assert evidence.half_speed_batch(rows) is None
