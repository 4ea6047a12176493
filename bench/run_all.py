"""Run the whole benchmark suite, then redraw the plots and regenerate BENCHMARKS.md.

    .venv/bin/python -m bench.run_all [--quick] [--runs 3] [--skip NAME ...] [--only NAME ...]
                                      [--report-only]

(``make bench`` runs it without flags.) Scripts, in order, each as its own process (one
failing does not stop the others; the exit code says whether all succeeded):

    demo           bench.scenarios.solve --runs 5  -> bench/results/solve.json  (default config, seeds 0-4)
    transport      bench.scenarios.transport       -> bench/results/transport.json
    latency        bench.scenarios.latency         -> bench/results/latency.json
    rlinkd_solve   bench.scenarios.rlinkd_solve    -> bench/results/solve_compare.json
    rllib          bench.scenarios.rllib_baseline  -> bench/results/rllib.json  (~30+ min, saturates the machine)
    profile        bench.scenarios.profile_demo    -> bench/results/profile.json
    soak           bench.scenarios.soak            -> bench/results/soak.json   (10 min, 64 TCP + 8 shm clients)
    chaos          bench.scenarios.chaos           -> bench/results/chaos.json  (20 kills)
    fuzz           pytest tests/process/test_fuzz_live.py -> bench/results/fuzz.json
    flood          bench.scenarios.flood           -> bench/results/flood.json  (1,000 silent sockets, 5 runs)

(declared in ``bench.scenarios.SUITE``; the targets in ``bench.report.targets``).

``--quick`` is a smoke test: ``--quick`` to the benchmark scripts (small sizes, one run, the
RLlib baseline reduced to one 90-s external-mode run of ray 2.48), one demo run, a 60-s soak,
a 4-kill chaos run and a 200-socket flood (those write ``*-quick.json`` files the report
never cites). Then the pictures are redrawn by ``bench.report.plots`` into
``bench/results/plots/`` and BENCHMARKS.md is regenerated whole by ``bench.report.today``
from the result files ``bench/report/benchmarks.toml`` cites (a scenario run under another
``--out`` is published by pointing its entry there). ``--report-only`` skips the scenarios.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from bench.harness.common import REPO, RESULTS
from bench.report import plots
from bench.report import today
from bench.report.section import load
from bench.scenarios import SUITE


def script_command(name: str, quick: bool, runs: int) -> list[str]:
    scenario = SUITE[name]
    args = [a.format(runs=runs, results=RESULTS) for a in (scenario.quick if quick else scenario.full)]
    return [sys.executable, "-m", scenario.module, *args]


def run_script(name: str, quick: bool, runs: int) -> dict:
    """Run one scenario (output streamed through); returns its exit code and duration."""
    cmd = script_command(name, quick, runs)
    print(f"\n===== {name}: {' '.join(cmd[1:])}", flush=True)
    t0 = time.monotonic()
    # the fuzz module writes its figures only when asked to (a plain test run writes nothing)
    env = dict(os.environ, RLINKD_FUZZ_REPORT=str(RESULTS / SUITE["fuzz"].result_file)) \
        if name == "fuzz" and not quick else None
    code = subprocess.call(cmd, cwd=REPO, env=env)
    took = round(time.monotonic() - t0, 1)
    print(f"===== {name}: exit {code} after {took} s", flush=True)
    return {"exit": code, "seconds": took}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="pass --quick to every script (smoke test)")
    ap.add_argument("--runs", type=int, default=3, help="runs per configuration of the solve benchmarks")
    ap.add_argument("--skip", nargs="+", default=[], choices=list(SUITE))
    ap.add_argument("--only", nargs="+", default=[], choices=list(SUITE))
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    names = [n for n in (args.only or SUITE) if n not in args.skip]
    ran = {} if args.report_only else {n: run_script(n, args.quick, args.runs) for n in names}
    results = {name: load(name) for name in SUITE}
    plots.draw_all(plots.rlinkd_curves(), results["rllib"])
    plots.draw_envs()
    today.BENCHMARKS_MD.write_text(today.render())
    print(f"updated {today.BENCHMARKS_MD}")
    failed = [n for n, r in ran.items() if r["exit"] != 0]
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
