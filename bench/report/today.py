"""BENCHMARKS.md, the benchmark report of today, generated whole from ``bench/results``.

``bench/report/benchmarks.toml`` (hand-written) says what the report shows: an introduction,
the machines, and one entry per capability (title, command, date, machine, peer, a body, the
plots). Every figure that comes from a scenario is a placeholder filled from a result file:

    {serving/one_client_us/shm/p50}        a value: file stem, then keys (list indices as numbers)
    {c_client_many/actions_per_s/tcp:mm}   a {median, min, max} dict: "median (min – max)"
    {x/y/median:,.1f}                       any Python format spec
    {a/median ÷ b/median:.1f}              a ratio of two values
    {c_client_many/actions_per_s/tcp/median:≥30000}   "met" or "**MISSED**" against a bound
    {@solve_targets}                        a generated block (``BLOCKS``)

Figures measured by hand (no scenario writes them) are literal text in the TOML with their
command, date, machine and peer. A placeholder naming a missing file or key is an error, so
the report cannot cite what bench/results no longer holds. ``render()`` is deterministic (no
clock, no host probing): tests check that BENCHMARKS.md equals it.
"""
from __future__ import annotations

import json
import string
import tomllib
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from bench.harness.common import REPO, RESULTS, fmt_num
from bench.report import section

BENCHMARKS_MD = REPO / "BENCHMARKS.md"
SPEC = Path(__file__).with_name("benchmarks.toml")


@cache
def result(stem: str, results_dir: Path = RESULTS) -> dict:
    """The parsed ``<stem>.json`` of bench/results (KeyError naming it when absent)."""
    path = results_dir / f"{stem}.json"
    if not path.exists():
        raise KeyError(f"the report cites {path.name}, which bench/results does not hold")
    return json.loads(path.read_text())


def lookup(path: str, results_dir: Path = RESULTS) -> Any:
    """``stem/key/key/...`` -> the value (KeyError naming the path when any key is missing)."""
    stem, *keys = path.strip().split("/")
    value: Any = result(stem, results_dir)
    for key in keys:
        try:
            value = value[int(key)] if isinstance(value, list) else value[key]
        except (KeyError, IndexError, ValueError):
            raise KeyError(f"{path}: no {key!r} in {stem}.json") from None
    return value


def _median_range(value: dict, spec: str) -> str:
    show: Callable[[Any], str] = (lambda v: format(v, spec)) if spec else fmt_num
    return f"{show(value['median'])} ({show(value['min'])} – {show(value['max'])})"


def _verdict(value: float, spec: str) -> str:
    bound = float(spec[1:])
    met = value >= bound if spec[0] == "≥" else value <= bound
    return "met" if met else "**MISSED**"


class _Figures(string.Formatter):
    """str.format with result-file paths for field names (see the module docstring)."""

    def __init__(self, results_dir: Path) -> None:
        self.results_dir = results_dir

    def get_field(self, field_name: str, args: Any, kwargs: Any) -> tuple[Any, str]:
        if field_name.startswith("@"):
            return BLOCKS[field_name[1:]](self.results_dir), field_name
        if "÷" in field_name:
            top, bottom = (lookup(p, self.results_dir) for p in field_name.split("÷"))
            return top / bottom, field_name
        return lookup(field_name, self.results_dir), field_name

    def format_field(self, value: Any, format_spec: str) -> str:
        if format_spec.startswith("mm"):
            return _median_range(value, format_spec[2:])
        if format_spec[:1] in ("≥", "≤"):
            return _verdict(value, format_spec)
        if not format_spec and isinstance(value, (int, float)) and not isinstance(value, bool):
            return _number(value)
        return super().format_field(value, format_spec)


def _number(value: float) -> str:
    """A figure without a format spec: whole numbers from 100 up, else at most one decimal."""
    if abs(value) >= 100:
        return fmt_num(value)
    return f"{value:.1f}".removesuffix(".0")


def _doc(results_dir: Path, stem: str) -> dict | None:
    path = results_dir / f"{stem}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _solve_targets(d: Path) -> str:
    solve, rllib = _doc(d, "solve_compare"), _doc(d, "rllib")
    lines = section.solve_target_lines(solve, rllib) + section.latency_target_lines(None, solve)
    return "\n".join(lines)


def _ratio_table(d: Path) -> str:
    rows = section.ratio_rows(_doc(d, "solve_compare") or {}, _doc(d, "rllib") or {})
    return section.md_table(("definition", "RLlib", "rlinkd clients", "wall time", "env steps",
                             "steps/s", "peak RSS"), rows)


def _reliability(d: Path) -> str:
    rows = section.reliability_rows(_doc(d, "fuzz"), _doc(d, "soak"), _doc(d, "chaos"))
    return section.md_table(("run", "figure", "value"), rows)


BLOCKS: dict[str, Callable[[Path], str]] = {
    "solve_targets": _solve_targets,
    "ratio_table": _ratio_table,
    "transport_targets": lambda d: "\n".join(section.transport_target_lines(_doc(d, "transport"))),
    "latency_targets": lambda d: "\n".join(section.latency_target_lines(_doc(d, "latency"), None)),
    "image_targets": lambda d: "\n".join(section.image_target_lines(_doc(d, "image_ingest"))),
    "flood_targets": lambda d: "\n".join(section.flood_target_lines(_doc(d, "flood"))),
    "reliability": _reliability,
}


def _capability(cap: dict, machines: dict, fill: Callable[[str], str]) -> str:
    """One capability's section: heading, provenance lines, body, plots."""
    lines = [f"## {cap['title']}", "",
             f"- Command: {fill(cap['command'])}",
             f"- Measured: {fill(cap['date'])}, on {machines[cap['machine']]}",
             f"- Peer: {fill(cap['peer'])}", "", fill(cap["body"]).strip()]
    for plot in cap.get("plots", []):
        if not (REPO / plot["file"]).exists():
            raise KeyError(f"the report shows {plot['file']}, which does not exist")
        lines += ["", f"![{plot['caption']}]({plot['file']})"]
    return "\n".join(lines)


def render(spec_path: Path = SPEC, results_dir: Path = RESULTS) -> str:
    """The whole of BENCHMARKS.md."""
    spec = tomllib.loads(spec_path.read_text())
    formatter = _Figures(results_dir)
    fill = lambda text: formatter.format(text)  # noqa: E731
    contents = "\n".join(f"- [{c['title']}](#{_anchor(c['title'])})" for c in spec["capability"])
    parts = [f"# {spec['title']}", fill(spec["intro"]).strip(), contents]
    parts += [_capability(c, spec["machines"], fill) for c in spec["capability"]]
    return "\n\n".join(parts) + "\n"


def _anchor(title: str) -> str:
    """GitHub's and mkdocs' heading anchor: lower case, punctuation dropped, spaces to '-'."""
    kept = "".join(ch for ch in title.lower() if ch.isalnum() or ch in " -_")
    return kept.replace(" ", "-")


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m bench.report",
                                 description="regenerate BENCHMARKS.md from bench/results")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 when BENCHMARKS.md differs from what it would be")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        current = BENCHMARKS_MD.read_text() if BENCHMARKS_MD.exists() else ""
        if current != text:
            print("BENCHMARKS.md is not current: run `make bench-report`")
            return 1
        return 0
    BENCHMARKS_MD.write_text(text)
    return 0
