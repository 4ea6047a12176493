"""Time-to-solve benchmark: `rlinkd demo` (daemon + N CartPole clients) until mean return 450.

    python -m bench.scenarios.solve [--runs 5] [--clients 2] [--transport tcp]

Run i uses `rlinkd demo --seed i` (learner and client seeds), default config otherwise, so
the runs are the "solves in 5 of 5 seeds" check of the tuned defaults. Measures from
outside, per run: wall time from launch to SOLVED, env steps to solve (from the daemon),
peak summed RSS of the whole process tree (daemon, its children, clients), and CPU-seconds.
Prints medians (min–max) and writes bench/results/solve.json.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from bench.harness.common import median_range, write_result
from bench.harness.demo import demo_command, demo_summary
from bench.harness.proctree import TreeSampler


def one_run(clients: int, transport: str, seed: int, overrides: list[str]) -> dict:
    cmd = demo_command(clients, transport, seed, overrides)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler = TreeSampler(proc.pid).start()
    out, _ = proc.communicate(timeout=900)
    sampler.stop()
    summary = demo_summary(out)
    return {"seed": seed, "solved": bool(summary.get("solved")) and proc.returncode == 0,
            "wall_s": round(time.monotonic() - t0, 2), "demo_wall_s": summary.get("wall_s"),
            "env_steps": summary.get("env_steps"), "peak_rss_mb": round(sampler.peak_rss_bytes / 2**20, 1),
            "cpu_s": round(sampler.cpu_s, 1)}


def summarize(runs: list[dict]) -> dict:
    keys = ("wall_s", "env_steps", "peak_rss_mb", "cpu_s")
    return {k: median_range([r[k] for r in runs]) for k in keys} | {
        "solved_runs": sum(r["solved"] for r in runs), "runs": len(runs)}


def table_markdown(result: dict) -> str:
    """Medians (min – max) and the per-seed outcome, for BENCHMARKS.md."""
    s = result["summary"]
    rows = [("wall time to solve (launch → SOLVED)", f"{s['wall_s']['median']:.1f} s",
             f"{s['wall_s']['min']:.1f} – {s['wall_s']['max']:.1f} s"),
            ("env steps to solve", f"{s['env_steps']['median']:,.0f}",
             f"{s['env_steps']['min']:,.0f} – {s['env_steps']['max']:,.0f}"),
            ("peak summed RSS (demo, daemon, clients)", f"{s['peak_rss_mb']['median']:.0f} MB",
             f"{s['peak_rss_mb']['min']:.0f} – {s['peak_rss_mb']['max']:.0f} MB"),
            ("CPU time, all processes", f"{s['cpu_s']['median']:.1f} s",
             f"{s['cpu_s']['min']:.1f} – {s['cpu_s']['max']:.1f} s")]
    lines = ["| measure | median | min – max |", "| --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    seeds = ", ".join(f"seed {r['seed']}: {'solved' if r['solved'] else 'NOT solved'} in {r['wall_s']:.1f} s"
                      for r in result["runs"])
    return "\n".join(lines) + f"\n\n{s['solved_runs']} of {s['runs']} seeds solved ({seeds})."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--out", help="result file (default: bench/results/solve.json)")
    args = ap.parse_args()
    runs = []
    for i in range(args.runs):
        runs.append(one_run(args.clients, args.transport, i, args.set))
        print(json.dumps({"run": i + 1, **runs[-1]}), flush=True)
    result = {"clients": args.clients, "transport": args.transport, "runs": runs, "summary": summarize(runs)}
    result["table_markdown"] = table_markdown(result)
    write_result("solve", result, args.out)
    print(json.dumps(result["summary"], indent=1))
    return 0 if all(r["solved"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
