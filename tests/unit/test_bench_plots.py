"""bench.report.plots: what each learning-curve picture draws, and that a PNG is written."""
from __future__ import annotations

import json
from pathlib import Path

from rlinkd.daemon.demo import progress_line

from bench.harness.curves import demo_output_points, demo_points, make_curve
from bench.report import plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(steps: int, seconds: float, solved: bool = True, with_curve: bool = True) -> dict:
    doc = {"solved": solved, "wall_s": seconds, "env_steps": steps}
    if with_curve:
        doc["curve"] = make_curve([(seconds * i / 10, steps * i / 10, 45.0 * i) for i in range(11)])
    return doc


SOLVE = {"client": {"tcpx1": {"runs": [run(60_000, 14.0), run(64_000, 15.0)]},
                    "shmx2": {"runs": [run(58_000, 12.0)]}},
         "own": {"tcpx1": {"runs": [run(35_000, 9.0)]}}}
RLLIB = {"versions": {"2.48.0": {"modes": {"external": {"runs": [run(248_000, 107.0, with_curve=False),
                                                                 run(90_000, 60.0, solved=False, with_curve=False)]}}},
                      "2.60.0": {"modes": {"external": {"runs": [run(88_000, 56.0)]}}}}}


def test_series_pairs_the_same_definition_and_marks_runs_without_a_curve():
    drawn = plots.series(plots.FIGURES[0], SOLVE, RLLIB)
    by_label = {s.label.split(":")[0]: s for s in drawn}
    assert list(by_label) == ["rlinkd tcp × 1 client(s)", "rlinkd shm × 2 client(s)", "RLlib 2.48.0 (external)",
                              "RLlib 2.60.0 (external)"]
    assert len(by_label["rlinkd tcp × 1 client(s)"].curves) == 2
    old = by_label["RLlib 2.48.0 (external)"]
    assert old.curves == [] and old.reached == [(107.0, 248_000)]  # the unsolved run is not drawn
    assert "reached 450 here" in old.label
    own = plots.series(plots.FIGURES[1], SOLVE, RLLIB)
    assert [s.label for s in own] == ["rlinkd tcp × 1 client(s)"]  # no RLlib example runs here
    assert plots.series(plots.FIGURES[0], None, None) == []


def test_draw_all_writes_a_png_per_figure_and_markdown_links_them(tmp_path):
    written = plots.draw_all(SOLVE, RLLIB, tmp_path)
    assert [p.name for p in written] == ["learning_curves_client.png", "learning_curves_own.png"]
    for path in written:
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    text = plots.markdown(written, base=tmp_path)
    assert "](learning_curves_client.png)" in text and text.count("![") == 2
    assert plots.draw_all(None, None, tmp_path / "none") == []
    assert not Path(tmp_path / "none").exists()


def test_curves_are_thinned_and_demo_progress_lines_parsed():
    curve = make_curve([(i, i * 10, i / 2) for i in range(1000)], max_points=5)
    assert curve["env_steps"] == [0, 2500, 5000, 7490, 9990] and len(curve["wall_s"]) == 5
    assert make_curve([(0.0, 0, None), (1.0, 10, 9.5)])["return_mean"] == [9.5]
    shown = progress_line(2.0, {"env_steps": 12345, "episode_return_mean_20": 45.5})
    lines = [(1.0, progress_line(1.0, {})), (2.1, shown), (2.2, "rlinkd demo: 2 tcp client(s)")]
    assert demo_points(lines) == [(2.1, 12345.0, 45.5)]
    output = "\n".join(line for _, line in lines)  # a finished demo: the lines' own clock
    assert demo_output_points(output) == [(2.0, 12345.0, 45.5)]


def test_rlinkd_curves_come_from_the_first_result_file_that_has_one(tmp_path):
    assert plots.rlinkd_curves(tmp_path) is None
    published = {"client": {"tcpx1": {"runs": [run(60_000, 14.0, with_curve=False)]}}}
    (tmp_path / "solve_compare.json").write_text(json.dumps(published))
    assert plots.rlinkd_curves(tmp_path) == published  # drawn as markers
    (tmp_path / "solve_curves.json").write_text(json.dumps(SOLVE))
    assert plots.rlinkd_curves(tmp_path) == SOLVE
    (tmp_path / "solve_compare.json").write_text(json.dumps(SOLVE | {"newer": True}))
    assert plots.rlinkd_curves(tmp_path)["newer"]


def test_caption_names_each_source_and_its_load():
    text = plots.caption({"command": "python -m x --out y", "measured_at": "2026-11-23 19:15:14",
                          "load_avg_1m_at_end": 7.48}, None)
    assert "rlinkd: `python -m x --out y` (2026-11-23 19:15:14, load average 7.48 at the end)" in text
    assert "RLlib: no results" in text


def test_env_figures_draw_each_system_of_a_scenario_result(tmp_path):
    """sac_pendulum.json-shaped results: a line per run, one series per system; a run without
    a curve but solved is a marker; a missing file draws nothing."""
    curve = {"wall_s": [1.0, 2.0], "env_steps": [200, 400], "return_mean": [-1200.0, -300.0]}
    doc = {"systems": {"rlinkd": {"runs": [{"curve": curve}, {"curve": curve}]},
                       "sb3": {"runs": [{"curve": curve}]},
                       "empty": {"runs": [{"solved": False}]}}}
    fig = plots.ENV_FIGURES[0]
    drawn = plots.env_series(fig, doc)
    assert [(s.label, len(s.curves)) for s in drawn] == [("rlinkd", 2), ("sb3", 1)]
    marker = plots.env_series(fig, {"algorithms": {"dqn": {"runs": [
        {"solved": True, "wall_s": 30.0, "env_steps": 9000}]}}})
    assert marker[0].reached == [(30.0, 9000)] and "-200" in marker[0].label
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / fig.results[0]).write_text(json.dumps(doc))
    written = plots.draw_envs(tmp_path / "results", tmp_path / "plots")
    assert [p.name for p in written] == [fig.file] and written[0].stat().st_size > 1000


def test_env_figures_merge_the_systems_of_several_result_files():
    """The DQN figure draws rlinkd's and SB3's runs from their own files; a system named in two
    files (seeds run separately) gets the runs of both."""
    curve = {"wall_s": [1.0], "env_steps": [100], "return_mean": [20.0]}
    doc = plots.merged([{"systems": {"rlinkd": {"runs": [{"curve": curve}]}}}, None,
                        {"systems": {"rlinkd": {"runs": [{"curve": curve}]}, "sb3": {"runs": [{"curve": curve}]}}},
                        {"algorithms": {"dqn": {"runs": []}}},
                        {"versions": {"2.60.0": {"modes": {"external": {"runs": [{"curve": curve}]}}}}}])
    assert {name: len(s["runs"]) for name, s in doc["systems"].items()} == {
        "rlinkd": 2, "sb3": 1, "dqn": 0, "RLlib 2.60.0 PPO (external)": 1}
