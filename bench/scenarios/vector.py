"""Vectorized client vs the demo: one process stepping 64 CartPole copies over shared memory
against the two-client demo, in the same run, each until mean return 450.

    python -m bench.scenarios.vector [--runs 3] [--num-envs 64] [--quick]

Per run and seed, alternating the two definitions (so machine noise hits both alike):
``rlinkd demo --clients 2 --transport tcp`` (the demo, default settings) and ``rlinkd demo
--clients 1 --num-envs 64 --transport shm`` with ``VECTOR_SETTINGS`` (one vectorized client;
samples and batches sized for 64 copies). Measures wall time to SOLVED, env
steps to solve, and env steps/s (the daemon's own rate, median of its once-a-second
progress lines once training has begun). Writes bench/results/vector.json.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time

from bench.harness.common import median_range, write_result
from bench.harness.demo import demo_command, demo_summary

RATE = re.compile(r"steps\s+([\d,]+)\s+([\d,]+) steps/s")
VECTOR_SETTINGS = ["sampling.env_steps_per_sample=4096", "sampling.train_batch_size=4096",
                   "ppo.minibatch_size=2048", "ppo.num_epochs=4"]
"""The vectorized client's daemon: a sample is 64 steps of each of 64 copies, one batch per
sample, 2 minibatches of 2048, 4 epochs (the demo keeps the defaults: 256-step samples,
512-step batches, minibatches of 128, 10 epochs)."""
DEFINITIONS = {"demo (2 TCP clients)": (2, 1, "tcp", []),
               "vectorized (1 shm client, N envs)": (1, None, "shm", VECTOR_SETTINGS)}


def one_run(clients: int, num_envs: int, transport: str, seed: int, timeout_s: float,
            overrides: list[str]) -> dict:
    cmd = [*demo_command(clients, transport, seed, overrides, timeout_s=timeout_s),
           "--num-envs", str(num_envs)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout_s + 120)
    summary = demo_summary(proc.stdout)
    rates = [int(m.group(2).replace(",", "")) for m in RATE.finditer(proc.stdout)
             if int(m.group(1).replace(",", "")) > 0]
    return {"seed": seed, "solved": bool(summary.get("solved")) and proc.returncode == 0,
            "wall_s": round(time.monotonic() - t0, 2), "env_steps": summary.get("env_steps"),
            "env_steps_per_s": statistics.median(rates[1:] or rates or [0])}


def summarize(runs: list[dict]) -> dict:
    return {k: median_range([r[k] for r in runs if r[k] is not None]) for k in
            ("wall_s", "env_steps", "env_steps_per_s")} | {
        "solved_runs": sum(r["solved"] for r in runs), "runs": len(runs)}


def table_markdown(result: dict) -> str:
    lines = ["| client | solved | wall time to 450 | env steps to 450 | env steps/s |",
             "| --- | --- | --- | --- | --- |"]
    for name, s in result["summary"].items():
        lines.append(f"| {name} | {s['solved_runs']}/{s['runs']} | {s['wall_s']['median']:.1f} s "
                     f"({s['wall_s']['min']:.1f} – {s['wall_s']['max']:.1f}) | "
                     f"{s['env_steps']['median']:,.0f} | {s['env_steps_per_s']['median']:,.0f} "
                     f"({s['env_steps_per_s']['min']:,.0f} – {s['env_steps_per_s']['max']:,.0f}) |")
    demo, vec = (result["summary"][k]["env_steps_per_s"]["median"] for k in DEFINITIONS)
    return "\n".join(lines) + f"\n\nVectorized / demo env steps/s: {vec / max(demo, 1):.1f}x."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--num-envs", type=int, default=64)
    ap.add_argument("--timeout-s", type=float, default=600.0)
    ap.add_argument("--quick", action="store_true", help="one run each, short timeout")
    ap.add_argument("--out", help="result file (default: bench/results/vector.json)")
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {name: [] for name in DEFINITIONS}
    for seed in range(1 if args.quick else args.runs):
        for name, (clients, envs, transport, overrides) in DEFINITIONS.items():
            run = one_run(clients, envs or args.num_envs, transport, seed,
                          120.0 if args.quick else args.timeout_s, overrides)
            runs[name].append(run)
            print(json.dumps({"definition": name, **run}), flush=True)
    result = {"num_envs": args.num_envs, "runs": runs,
              "summary": {name: summarize(r) for name, r in runs.items()}}
    result["table_markdown"] = table_markdown(result)
    write_result("vector-quick" if args.quick else "vector", result, args.out)
    print(result["table_markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
