"""Hyperparameter sweep for the defaults: time-to-solve of `rlinkd demo` per candidate.

    python -m bench.scenarios.tune --seeds 5 --candidate "default=" --candidate "e4=ppo.num_epochs=4" ...

Each candidate is NAME=KEY=VALUE[,KEY=VALUE...] (config overrides); each runs on every
seed (learner seed and client seeds). Reports per candidate: solved runs, median (min–max)
wall time and env steps. Writes bench/results/tune.json.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from bench.harness.common import median_range, write_result
from bench.harness.demo import demo_command, demo_summary


def parse_candidate(text: str) -> tuple[str, list[str]]:
    name, _, overrides = text.partition("=")
    return name, [o for o in overrides.split(",") if o]


def run(overrides: list[str], seed: int, clients: int, timeout_s: float) -> dict:
    cmd = demo_command(clients, seed=seed, overrides=overrides, timeout_s=timeout_s)
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s + 120).stdout
    summary = demo_summary(out)
    return {"seed": seed, "solved": bool(summary.get("solved")), "wall_s": round(time.monotonic() - t0, 2),
            "env_steps": summary.get("env_steps")}


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if r["solved"]]
    return {"solved": f"{len(ok)}/{len(runs)}", "wall_s": median_range([r["wall_s"] for r in ok], 2),
            "env_steps": median_range([r["env_steps"] for r in ok], 0)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidate", action="append", default=[])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--timeout-s", type=float, default=300)
    ap.add_argument("--out", help="result file (default: bench/results/tune.json)")
    args = ap.parse_args()
    results = {}
    for text in args.candidate or ["default="]:
        name, overrides = parse_candidate(text)
        runs = [run(overrides, seed, args.clients, args.timeout_s) for seed in range(args.seeds)]
        results[name] = {"overrides": overrides, "runs": runs, **summarize(runs)}
        print(json.dumps({name: {k: v for k, v in results[name].items() if k != "runs"}}), flush=True)
    write_result("tune", {"candidates": results}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
