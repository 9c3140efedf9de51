"""Each page's work, its predicted time, and the trim that fits a GPU page in its budget."""
import tempfile
from pathlib import Path

import pytest
import torch

from mgpu_lib.book import pages
from mgpu_lib.book.pages import (PAGES, budget_s, ddp_process_counts, ex1_plan, expected_line,
                            page_jobs, predict, prediction_table, setup_page, span)
from mgpu_lib.book.profiles import get_profile

ROOT = Path(__file__).resolve().parent.parent
FULL, CPU, SMOKE = (get_profile(n) for n in ("full", "cpu", "smoke"))


def test_every_notebook_is_a_page_and_every_page_a_notebook():
    stems = {p.stem for d in ("chapters", "exercises") for p in (ROOT / d).glob("*.ipynb")}
    assert stems == set(PAGES)


@pytest.mark.parametrize("page", PAGES)
def test_on_a_t4_every_page_is_trimmed_to_fit_the_budget(page, monkeypatch):
    monkeypatch.delenv("MGPU_PAGE_BUDGET_MIN", raising=False)
    pred = predict(page, FULL, "Tesla T4", 1)
    assert pred["seconds"][0] <= budget_s() * 1.02, (page, pred)
    if pred["cuts"]:
        assert pred["profile"].name == pred["profile"].config().profile == "full, trimmed"
        assert "trimmed to fit 15 min" in expected_line(pred)
    for gpu in ("Tesla T4", "NVIDIA H200", "Radeon Pro W7900 with a long marketing name"):
        lines = expected_line(predict(page, FULL, gpu, 1)).splitlines()
        assert max(map(len, lines)) <= 88, lines       # the book's column


def test_the_trim_has_real_work_to_do_on_a_t4_and_says_each_cut(monkeypatch):
    monkeypatch.delenv("MGPU_PAGE_BUDGET_MIN", raising=False)
    untrimmed = pages.STARTUP_S + pages.gpu_seconds(page_jobs("ex1_hyperparameters", FULL, 1),
                                                    pages.spec_for_name("T4"))
    assert untrimmed > budget_s()
    pred = predict("ex1_hyperparameters", FULL, "Tesla T4", 1)
    assert pred["cuts"][0] == "1 of 3 seeds" and pred["profile"].seeds == (0,)
    assert pred["profile"].train_limit < 60_000       # one seed was not enough
    # a page whose seeds do not matter is not said to have lost them
    assert not any("seed" in c for c in predict("06_performance", FULL, "Tesla T4", 1)["cuts"])


def test_no_budget_means_no_cuts_and_a_bad_budget_is_one_line(monkeypatch):
    monkeypatch.setenv("MGPU_PAGE_BUDGET_MIN", "0")
    assert predict("ex1_hyperparameters", FULL, "Tesla T4", 1)["cuts"] == []
    monkeypatch.setenv("MGPU_PAGE_BUDGET_MIN", "soon")
    with pytest.raises(ValueError, match="MGPU_PAGE_BUDGET_MIN must be a number"):
        budget_s()


def test_a_faster_gpu_needs_fewer_cuts(monkeypatch):
    monkeypatch.delenv("MGPU_PAGE_BUDGET_MIN", raising=False)
    t4 = predict("ex1_hyperparameters", FULL, "Tesla T4", 1)
    h200 = predict("ex1_hyperparameters", FULL, "NVIDIA H200", 1)
    assert (h200["profile"].train_limit or 60_000) > t4["profile"].train_limit


def test_a_gpu_without_a_datasheet_gets_no_prediction_and_no_cuts():
    pred = predict("03_dataparallel", FULL, "Radeon Pro W7900", 1)
    assert pred["seconds"] is None and pred["cuts"] == [] and pred["profile"] is FULL
    assert expected_line(pred) == "expected: no prediction (Radeon Pro W7900 has no datasheet here)"


def test_cpu_predictions_are_a_range_from_the_recorded_cpus():
    lo, hi = predict("03_dataparallel", CPU)["seconds"]
    assert 0 < lo < hi                                  # two CPUs ~3x apart are recorded
    assert predict("03_dataparallel", CPU)["cuts"] == []


def test_recorded_ex1_costs_nothing_but_startup():
    assert page_jobs("ex1_hyperparameters", CPU) == []
    assert ex1_plan(CPU).recorded and ex1_plan(CPU).store.is_file()


def test_a_smoke_run_of_ex1_leaves_one_file_in_runs_and_none_in_the_temporary_folder(
        tmp_path, monkeypatch):
    """Before: every smoke run of ex1 left an mgpu-ex1-smoke-*.jsonl in the temporary folder,
    and then a scratch folder whenever nbval killed the kernel. Its store is now
    ./runs/ex1_smoke.jsonl, emptied by each new plan, so runs never pile up anywhere."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    plan = ex1_plan(SMOKE)
    assert plan.store == plan.runs and plan.store.resolve().parent == tmp_path / "runs"
    plan.store.parent.mkdir()
    plan.store.write_text("{}\n", encoding="utf-8")
    page_jobs("ex1_hyperparameters", SMOKE)              # a prediction (`pages`) deletes nothing
    assert plan.store.exists()
    assert ex1_plan(SMOKE).store == plan.store and not plan.store.exists()   # a fresh sweep
    assert not any((tmp_path / "tmp").iterdir())


@pytest.mark.parametrize("profile", [SMOKE, CPU, FULL])
def test_ex1_never_writes_inside_the_package(profile):
    """Pages read the package's records and write new runs to ./runs/ (or a scratch folder)."""
    package = (ROOT / "mgpu_lib").resolve()
    plan = ex1_plan(profile)
    assert package not in plan.runs.resolve().parents
    assert plan.recorded == (package in plan.store.resolve().parents)


def test_ex1_epochs_follow_the_profile():
    assert ex1_plan(FULL).epochs == [2, 5, 10, 20]


@pytest.mark.parametrize("batch, gpus, counts", [(256, 0, [1, 2]), (256, 1, [1]),
                                                 (256, 8, [1, 8]), (255, 4, [1, 3])])
def test_ddp_process_counts_never_ask_for_more_gpus_than_exist(batch, gpus, counts):
    assert ddp_process_counts(batch, gpus) == counts


def test_span_reads_as_words():
    assert span(30, 50) == "under a minute"
    assert span(300, 1020) == "about 5 to 17 min"
    assert span(30, 120) == "under a minute to 2 min"
    assert span(600, 600) == "about 10 min"
    assert span(3 * 3600, 3 * 3600) == "about 3.0 h"


def test_setup_page_on_a_mocked_t4_trims_and_says_so(monkeypatch):
    monkeypatch.delenv("MGPU_PAGE_BUDGET_MIN", raising=False)
    monkeypatch.setenv("MGPU_PROFILE", "full")
    monkeypatch.setattr(pages, "num_gpus", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla T4")
    monkeypatch.setattr(pages, "banner", lambda p: f"profile: {p.name}")
    profile, text = setup_page("ex1_hyperparameters")
    assert profile.name == "full, trimmed" and profile.seeds == (0,)
    assert "profile: full, trimmed" in text and "on one T4 (predicted" in text
    assert "trimmed to fit 15 min:\n  1 of 3 seeds\n" in text


def test_setup_page_on_this_cpu_keeps_the_profile(monkeypatch):
    monkeypatch.setenv("MGPU_PROFILE", "cpu")
    monkeypatch.setattr(pages, "num_gpus", lambda: 0)
    profile, text = setup_page("05_ddp")
    assert profile is CPU and text.count("\n") == 3 and "a 2-core CPU" in text
    assert "\nlibrary: mgpu_lib " in text          # which library the page runs


def test_the_readme_table_rows():
    rows = [line.strip("| ").split(" | ") for line in prediction_table()[2:]]
    assert [r[0] for r in rows] == list(PAGES)
    assert dict((r[0], r[3]) for r in rows)["01_network"] == "none"


@pytest.mark.parametrize("minutes, says", [("30", "cut to fit 30 min"), ("7.5", "cut to fit 7.5 min"),
                                           ("0", "cuts (no budget)")])
def test_the_table_names_the_budget_it_was_cut_to(minutes, says, monkeypatch):
    monkeypatch.setenv("MGPU_PAGE_BUDGET_MIN", minutes)
    assert says in pages.prediction_table()[0]
    pred = predict("ex1_hyperparameters", FULL, "Tesla T4", 1)
    if pred["cuts"]:
        assert f"trimmed to fit {minutes} min" in expected_line(pred)


@pytest.mark.parametrize("gpus", [0, 1])
def test_a_bad_budget_warns_the_same_with_or_without_a_gpu(gpus, monkeypatch):
    monkeypatch.setenv("MGPU_PAGE_BUDGET_MIN", "abc")
    monkeypatch.setenv("MGPU_PROFILE", "cpu")
    monkeypatch.setattr(pages, "num_gpus", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla T4")
    with pytest.warns(UserWarning, match="MGPU_PAGE_BUDGET_MIN must be a number.*using 15 min"):
        setup_page("03_dataparallel")


def test_gpu_predictions_carry_the_fitted_band_and_use_every_gpu(monkeypatch):
    monkeypatch.delenv("MGPU_PAGE_BUDGET_MIN", raising=False)
    lo, hi = predict("05_ddp", FULL, "Tesla T4", 1)["seconds"]
    assert lo < hi                                   # no published run names a T4: a range
    one = page_jobs("03_dataparallel", FULL, 1)
    two = page_jobs("03_dataparallel", FULL, 2)
    assert [j.devices for j in two] == [1, 2] and len(one) == 1
    pred = predict("03_dataparallel", FULL, "Tesla V100-SXM2-16GB", 2)
    assert pred["on"] == "2 x V100" and pred["seconds"][0] < pred["seconds"][1]


def test_a_multi_gpu_band_spans_all_four_corners_of_the_fit():
    """Before: only (high mfu, high thread_s) and (low, low) were tried, so on 2 GPUs the
    fastest corner (high mfu, no DataParallel Python) and the slowest were missed."""
    from mgpu_lib.perf.evidence import published_fit
    from mgpu_lib.perf.runtime import Job, gpu_band, gpu_seconds
    from mgpu_lib.perf.scaling import DEVICES
    jobs, v100, f = [Job("x", 1, 64, 256, 2, 60000, 10000, devices=2)], DEVICES["V100 SXM2"], \
        published_fit()
    corners = [gpu_seconds(jobs, v100, f.overheads(v100, c, t)) for c in (0, 2) for t in (0, 2)]
    assert gpu_band(jobs, v100) == pytest.approx((min(corners), max(corners)))
    assert min(corners) < gpu_seconds(jobs, v100, f.overheads(v100, 2, 2))


def test_the_readme_table_is_what_the_pages_command_prints():
    """The README's page-time table is a prediction printed by `python -m mgpu_lib pages`,
    pasted; regenerate it when the model or a page changes."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    missing = [r for r in prediction_table()[2:] if r not in readme]
    assert not missing, f"README's page-time table is stale; rerun `python -m mgpu_lib pages`: {missing}"


def test_the_pages_and_a_sweep_plan_share_one_cpu_prediction(monkeypatch):
    """Issue 29: one CPU prediction. A sweep's plan and a page's table come from
    `pages.predict_jobs` over the same jobs: a sweep of the cpu profile's one run is
    predicted as page 03's one run is, start-up aside."""
    from mgpu_lib.book import sweep
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    base = CPU.config()
    jobs = sweep.sweep_jobs(base, {"lr": [0.1]}, [0])
    low, high, on = sweep.predicted_sweep(base, {"lr": [0.1]}, [0])
    assert (low, high, on) == pages.predict_jobs(jobs)
    page = pages.predict_jobs([pages._run("one run", CPU)])
    assert page[:2] == pytest.approx((low, high)) and page[2] == on


@pytest.mark.parametrize("value", ["1e9", "inf", "nan", "-1", "10081"])
def test_an_absurd_page_budget_is_refused(monkeypatch, value):
    """Before: MGPU_PAGE_BUDGET_MIN=1e9 printed "cut to fit 1e+09 min"."""
    monkeypatch.setenv("MGPU_PAGE_BUDGET_MIN", value)
    with pytest.raises(ValueError, match="from 0 .no limit. to 10,080 .a week.") as e:
        budget_s()
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("seconds, words", [(59, "under a minute"), (600, "about 10 min"),
                                            (5 * 3600, "about 5.0 h"),
                                            (10 * 86400, "about 10 days"),
                                            (6237282134873648128 * 3600, "over a year")])
def test_times_read_in_sane_units(seconds, words):
    """Before: "6237282134873648128.0 h"."""
    assert pages.minutes(seconds) == words
