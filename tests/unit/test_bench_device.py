"""Tier 1: the GPU benchmarks' checks (issue 32) computed from figures, without a GPU."""
from __future__ import annotations

from bench.scenarios import device_defaults, learner_device, minatar


def rows(median: float) -> dict:
    return {"median": median, "min": median, "max": median, "n": 1}


def test_learner_device_checks_the_learner_against_0_8_of_the_graphed_reference():
    results = {"nature": {"cpu": {"learner": rows(1_000)},
                          "cuda": {"learner": rows(150_000), "plain-graphed": rows(200_000)}},
               "cartpole": {"cpu": {"learner": rows(40_000)},
                            "cuda": {"learner": rows(240_000), "plain-graphed": rows(280_000)}}}
    checks = {(c["case"], c["check"].split()[1]): c for c in learner_device.targets(results)}
    assert checks[("nature", "/")]["value"] == 0.75 and not checks[("nature", "/")]["met"]
    assert checks[("nature", "SGD")]["met"]  # 150,000 >= 140,000
    assert checks[("cartpole", "/")]["met"] and not checks[("cartpole", "SGD")]["met"]
    text = learner_device.targets_markdown(results)
    assert text.count("**MISSED**") == 2 and text.count(": met") == 2


def test_without_cuda_rows_there_is_no_check_and_the_report_says_not_measured():
    results = {"nature": {"cpu": {"learner": rows(1_000), "plain": rows(1_100)}}}
    assert learner_device.targets(results) == []
    text = learner_device.targets_markdown(results)
    assert text.startswith("- nature: ")
    assert text.endswith("not measured on a GPU (torch saw no CUDA device in this run)")


def test_device_defaults_ratio_is_defaults_over_forced_with_unsolved_runs_left_out():
    solved = lambda w: {"solved": True, "wall_s": w}  # noqa: E731
    s = device_defaults.pair_summary([solved(50), solved(60), {"solved": False, "wall_s": 900}],
                                     [solved(50), solved(52), solved(70)])
    assert (s["default_wall_s"], s["forced_wall_s"], s["ratio"], s["met"]) == (55, 52, 1.058, False)
    assert s["solved"] == "2/3 and 3/3"
    assert device_defaults.pair_summary([], [solved(1)])["met"] is None


def test_device_defaults_says_when_no_gpu_was_measured():
    assert "not measured on a GPU" in device_defaults.host_note(cuda=False, gpu_device=False)
    assert "not measured" not in device_defaults.host_note(cuda=True, gpu_device=True)
    assert device_defaults.check_cell(False, cuda=True) == "**MISSED**"
    assert "not measured on a GPU" in device_defaults.check_cell(True, cuda=False)


def test_minatar_comparison_puts_the_devices_side_by_side():
    run = {"learner_device": "cpu", "learner_device_choice": "fixed", "env_steps_per_s": 900.0,
           "updates_per_s": 1.5, "wall_s": 500.0, "return_mean_last_100": 5.0,
           "update_time_s": {"median": 0.4, "min": 0.4, "max": 0.4, "n": 1}}
    by_device = {d: {"summary": minatar.summary([run]), "runs": [run]} for d in ("cuda", "cpu")}
    text = minatar.comparison(by_device, 20_000)
    assert "| cuda | 900 | 1.50 | 0.400 | 5.00 | cpu |" in text
