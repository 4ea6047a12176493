"""BENCHMARKS.md: target verdicts, reliability rows, placeholders, and the file being current."""
from __future__ import annotations

import json

import pytest

from bench.harness.common import RESULTS
from bench.report import plots, today
from bench.report import section as report
from bench.report.today import BENCHMARKS_MD, SPEC


def summary(**medians) -> dict:
    return {k: {"median": v} for k, v in medians.items()} | {"solved_runs": 3, "runs": 3}


def rllib_doc(**modes) -> dict:
    return {"versions": {"2.48.0": {"modes": {m: {"summary": s} for m, s in modes.items()}}}}


def test_solve_targets_compare_against_the_best_rllib_and_name_partial_passes():
    rllib = rllib_doc(example=summary(wall_s=100.0, env_steps=100_000, steps_per_s=1_000, peak_rss_mb=1_800))
    solve = {"own": {"tcpx1": {"summary": summary(wall_s=10.0, env_steps=40_000, steps_per_s=6_000,
                                                  peak_rss_mb=700)},
                     "shmx1": {"summary": summary(wall_s=30.0, env_steps=40_000, steps_per_s=4_000,
                                                  peak_rss_mb=500)}}}
    lines = report.solve_target_lines(solve, rllib)
    by_measure = {line.split(": ")[1].split(" (")[0]: line for line in lines}
    assert by_measure["wall time ≤ 1/5 of the faster RLlib's"].endswith("**met by tcp × 1 only**")
    assert by_measure["env steps ≤ the more sample-efficient RLlib's"].endswith("**met**")
    assert by_measure["env steps/s ≥ 5 × RLlib's"].endswith("**met by tcp × 1 only**")
    assert by_measure["summed peak RSS ≤ 1/3 of RLlib's"].endswith("**met by shm × 1 only**")
    assert len(lines) == 4  # no client-side definition in either input: nothing invented


def test_missing_results_say_not_measured():
    assert "not measured" in report.solve_target_lines(None, None)[0]


def test_latency_targets_report_saturated_and_paced_points():
    latency = {"set_state_reply": {"on_policy": {"excluding_training_ms": {"p50": 6.1}}},
               "scaling": {"collector": [{"clients": 1, "reply_ms": {"p99": 1}},
                                         {"clients": 64, "reply_ms": {"p99": 120.0}}],
                           "paced": [{"offered_load": 0.5, "reply_ms": {"p99": 20.0}}]}}
    lines = report.latency_target_lines(latency, None)
    assert lines[0].endswith("6.1 ms — **MISSED**")
    assert "saturation: 120.0 ms — **MISSED**" in lines[1]
    assert "paced at 50% of capacity: 20.0 ms — **met**" in lines[2]


def test_reliability_rows_flag_mismatched_soak_clients():
    soak = {"duration_s": 60, "tcp_clients": 64, "shm_clients": 8, "steps_sent": 10, "steps_ingested": 9,
            "mismatched_clients": [{"key": "x"}], "dropped_episodes": 0, "rss_growth": 0.02,
            "rss_mb_start_end": [400, 408], "client_errors": [], "error_log_lines": []}
    rows = dict(((run, figure), value) for run, figure, value in report.reliability_rows(None, soak, None))
    assert rows[("soak", "steps sent / ingested")] == "10 / 9 (1 clients differ)"
    growth = rows[("soak", "summed RSS growth after warm-up (limit 10 %)")]
    assert growth.startswith("2.0 %") and growth.endswith("met")
    soak["rss_growth"] = 0.12
    rows = dict(((run, figure), value) for run, figure, value in report.reliability_rows(None, soak, None))
    assert rows[("soak", "summed RSS growth after warm-up (limit 10 %)")].endswith("MISSED")


def test_transport_targets_come_from_the_declarations_and_say_not_measured():
    transport = {"shm_single": {"steps_per_s": {"median": 900_000}},
                 "shm_batch": {"steps_per_s": {"median": 25_000_000}},
                 "idle_cpu": {"cpu_percent_of_one_core": 1.5, "clients": 8}}
    lines = report.transport_target_lines(transport)
    assert lines[0] == "- shm single steps ≥ 1,000,000 steps/s: 900,000 steps/s — **MISSED**"
    assert lines[1].endswith("25,000,000 steps/s — **met**")
    assert lines[2] == "- wake-up latency p50 (doorbell FIFO) ≤ 30 µs: **not measured**"
    assert lines[3] == "- idle daemon CPU ≤ 2 % of a core, 8 silent shm clients: 1.50 % — **met**"


def test_image_targets_show_each_path_beside_its_limit():
    image = {"shm": {"steps_per_s": {"median": 61_000}, "memcpy_steps_per_s": {"median": 250_000}},
             "tcp": {"steps_per_s": {"median": 4_000}, "decode_steps_per_s": {"median": 9_000}}}
    shm_line, tcp_line = report.image_target_lines(image)
    assert "(limit: one memcpy 250,000 steps/s): 61,000 steps/s — **met**" in shm_line
    assert "(limit: orjson.loads + b64decode 9,000 steps/s): 4,000 steps/s — **MISSED**" in tcp_line
    assert all(line.endswith("**not measured**") for line in report.image_target_lines(None))


def test_flood_target_reads_the_flooded_median_and_names_a_smaller_flood():
    assert report.flood_target_lines(None)[0].endswith("**not measured**")
    line = report.flood_target_lines({"sockets": 1000, "flooded_ms": {"median": 3.2}})[0]
    assert line.startswith("- a real client's connect → PING → SET_STATE") and line.endswith("3.2 ms — **met**")
    slow = report.flood_target_lines({"sockets": 200, "flooded_ms": {"median": 1500.0}})[0]
    assert "(measured with 200 sockets)" in slow and slow.endswith("**MISSED**")


# ---------------------------------------------------------------- BENCHMARKS.md, generated whole
def test_benchmarks_md_is_current():
    assert BENCHMARKS_MD.read_text() == today.render(), \
        "BENCHMARKS.md differs from bench/report/benchmarks.toml + bench/results: run `make bench-report`"


def test_every_result_file_is_cited_and_small_enough_to_open():
    cited = SPEC.read_text() + " ".join(f for fig in plots.ENV_FIGURES for f in fig.results)
    cited += " ".join(plots.RLINKD_CURVE_FILES)
    for path in RESULTS.glob("*.json"):
        assert f"{{{path.stem}/" in cited or path.name in cited, f"{path.name} is cited by nothing"
        assert path.stat().st_size < 1_000_000 and len(path.read_text().splitlines()) < 6_000, path.name


def test_placeholders_fill_figures_and_fail_on_missing_ones(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps(
        {"a": {"median": 1234.5, "min": 1000, "max": 2000}, "p": [{"x": 45.25}], "b": 8.0}))
    spec = tmp_path / "s.toml"
    body = "{r/a:mm} | {r/a:mm.1f} | {r/p/0/x} | {r/a/median ÷ r/b:.2f} | {r/p/0/x:≤50} | {r/b:≥9}"
    spec.write_text(SPEC_TEMPLATE.replace("BODY", body))
    today.result.cache_clear()
    text = today.render(spec, tmp_path)
    assert "1,234 (1,000 – 2,000) | 1234.5 (1000.0 – 2000.0) | 45.2 | 154.31 | met | **MISSED**" in text
    assert "- Command: `run r` (r.json)" in text and "on 2 cores" in text
    spec.write_text(SPEC_TEMPLATE.replace("BODY", "{r/a/mean}"))
    with pytest.raises(KeyError, match=r"r/a/mean: no 'mean' in r\.json"):
        today.render(spec, tmp_path)
    spec.write_text(SPEC_TEMPLATE.replace("BODY", "{gone/a}"))
    with pytest.raises(KeyError, match=r"cites gone\.json"):
        today.render(spec, tmp_path)
    today.result.cache_clear()


SPEC_TEMPLATE = """
title = "t"
intro = "i"
[machines]
m = "2 cores"
[[capability]]
title = "One"
command = "`run r` (r.json)"
date = "today"
machine = "m"
peer = "none"
body = "BODY"
"""
