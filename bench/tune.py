"""Hyperparameter sweep for the defaults: time-to-solve of `rlinkd demo` per candidate.

    python -m bench.tune --seeds 5 --candidate "default=" --candidate "e4=ppo.num_epochs=4" ...

Each candidate is NAME=KEY=VALUE[,KEY=VALUE...] (config overrides); each runs on every
seed (learner seed and client seeds). Reports per candidate: solved runs, median (min–max)
wall time and env steps. Writes bench/results/tune.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def parse_candidate(text: str) -> tuple[str, list[str]]:
    name, _, overrides = text.partition("=")
    return name, [o for o in overrides.split(",") if o]


def run(overrides: list[str], seed: int, clients: int, timeout_s: float) -> dict:
    cmd = [sys.executable, "-m", "rlinkd.daemon.cli", "demo", "--clients", str(clients), "--seed",
           str(seed), "--timeout-s", str(timeout_s), "--state-dir", tempfile.mkdtemp(),
           *[a for o in overrides for a in ("--set", o)]]
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s + 120).stdout
    summary = json.loads(out.strip().splitlines()[-1].split(" ", 1)[1])
    return {"seed": seed, "solved": summary["solved"], "wall_s": round(time.monotonic() - t0, 2),
            "env_steps": summary["env_steps"]}


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if r["solved"]]
    stat = lambda k: [statistics.median(r[k] for r in ok), min(r[k] for r in ok),  # noqa: E731
                      max(r[k] for r in ok)] if ok else None
    return {"solved": f"{len(ok)}/{len(runs)}", "wall_s": stat("wall_s"), "env_steps": stat("env_steps")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidate", action="append", default=[])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--timeout-s", type=float, default=300)
    ap.add_argument("--out", default=str(RESULTS / "tune.json"))
    args = ap.parse_args()
    results = {}
    for text in args.candidate or ["default="]:
        name, overrides = parse_candidate(text)
        runs = [run(overrides, seed, args.clients, args.timeout_s) for seed in range(args.seeds)]
        results[name] = {"overrides": overrides, "runs": runs, **summarize(runs)}
        print(json.dumps({name: {k: v for k, v in results[name].items() if k != "runs"}}), flush=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
