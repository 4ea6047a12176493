"""Learning curves in result files: one shape for every system, drawn by ``bench.report.plots``.

A run's ``"curve"`` is ``{"wall_s": [...], "env_steps": [...], "return_mean": [...]}``:
column lists of equal length in time order, each point the system's mean return at that
moment (which mean is the run's definition: rlinkd's last-20 in the daemon, the pooled
client-side last-100, RLlib's ``episode_return_mean``...). ``make_curve`` builds it from
points and thins it to at most ``MAX_POINTS`` (the result files stay small); the scenarios
call it once per run.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

MAX_POINTS = 300

Point = tuple[float, float, float]
"""(wall seconds since the run's start, env steps so far, mean return then)."""


def make_curve(points: Iterable[Point], max_points: int = MAX_POINTS) -> dict[str, list]:
    """The curve of ``points`` (None returns are dropped), evenly thinned, last point kept."""
    kept = [p for p in points if p[2] is not None]
    if len(kept) > max_points:
        step = (len(kept) - 1) / (max_points - 1)
        kept = [kept[round(i * step)] for i in range(max_points)]
    return {"wall_s": [round(p[0], 2) for p in kept], "env_steps": [int(p[1]) for p in kept],
            "return_mean": [round(p[2], 2) for p in kept]}


_DEMO_PROGRESS = re.compile(r"^\[\s*[\d.]+s\] steps\s+([\d,]+) .* mean return \(last 20\)\s+(-?\d+\.\d+)")


def demo_points(lines: Sequence[tuple[float, str]]) -> list[Point]:
    """Points from ``rlinkd demo`` progress lines read live as (arrival s, line): the
    daemon's env steps and last-20 mean (lines without a mean yet are skipped)."""
    points = []
    for t, line in lines:
        match = _DEMO_PROGRESS.match(line)
        if match:
            points.append((t, float(match.group(1).replace(",", "")), float(match.group(2))))
    return points


_DEMO_TIME = re.compile(r"^\[\s*([\d.]+)s\]")


def demo_output_points(output: str) -> list[Point]:
    """Points from a finished ``rlinkd demo``'s output, timed by the seconds each progress
    line carries (the demo's own clock, from its launch)."""
    timed = [(float(m.group(1)), line) for line in output.splitlines()
             if (m := _DEMO_TIME.match(line))]
    return demo_points(timed)
