"""Off-policy and asynchronous learners on CartPole-v1: PPO, APPO and DQN side by side.

    python -m bench.scenarios.offpolicy [--runs 3] [--transport tcp|shm] [--num-envs N] [--quick]
                                        [--out FILE]

Per seed, alternating: ``rlinkd demo`` (2 clients, TCP unless ``--transport shm``) with each algorithm until the mean
return of the last 20 episodes reaches ``--target`` (450 by default) or ``--timeout-s``
passes: wall time, env steps, the daemon's env steps/s. DQN runs with the settings below
(CartPole-sized, close to rl-baselines3-zoo's: lr 2.3e-3, target copy every 128 updates,
epsilon 1 → 0.04 over 8,000 steps, 3-step returns, 0.5 updates per env step); PPO and APPO
with the defaults; "dqn-paced" is DQN with `dqn.max_lead_steps=500` (clients held while the
learner is more than 500 env steps behind its ratio); "appo-paced" is APPO with
`appo.max_lead_steps=512` (clients held while a full train batch waits for the learner).
Writes bench/results/offpolicy.json.
"""
from __future__ import annotations

import argparse
import subprocess
import time

import orjson

from bench.harness.common import median_range, write_result
from bench.harness.curves import demo_output_points, make_curve
from bench.harness.demo import demo_command, demo_summary

ALGORITHMS = {
    "ppo": [],
    "appo": ["learner.algorithm=appo"],
    "dqn": ["learner.algorithm=dqn", "dqn.n_step=3", "dqn.lr=0.0023",
            "dqn.target_update_interval_updates=128", "dqn.epsilon_decay_steps=8000",
            "dqn.epsilon_end=0.04", "dqn.learning_starts_steps=1000"],
}
ALGORITHMS["dqn-paced"] = [*ALGORITHMS["dqn"], "dqn.max_lead_steps=500"]
# APPO with its clients held while a full train batch (512 steps) waits for the learner: on
# these two shared cores the clients then leave the learner its CPU
ALGORITHMS["appo-paced"] = [*ALGORITHMS["appo"], "appo.max_lead_steps=512"]
# trials (2026-11-26, fifth session, 2 shm clients, 3 seeds): 5 epochs per batch instead of 10
# (11.1 s to 450, 6.7 - 16.0), a lead of two batches (21.6 s: 1,024-step batches learn slower)
ALGORITHMS["appo-paced-e5"] = [*ALGORITHMS["appo-paced"], "ppo.num_epochs=5"]
ALGORITHMS["appo-paced-2b"] = [*ALGORITHMS["appo"], "appo.max_lead_steps=1024"]


def solve_run(algorithm: str, seed: int, target: float, timeout_s: float, transport: str = "tcp",
              num_envs: int = 1) -> dict:
    overrides = ALGORITHMS[algorithm]
    cmd = [*demo_command(2, transport, seed, overrides, timeout_s=timeout_s), "--target", str(target),
           "--num-envs", str(num_envs)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout_s + 120)
    s = demo_summary(proc.stdout)
    wall = round(time.monotonic() - t0, 2)
    steps = s.get("env_steps") or 0
    return {"seed": seed, "solved": bool(s.get("solved")), "wall_s": wall, "env_steps": steps,
            "env_steps_per_s": round(steps / max(s.get("wall_s") or wall, 1e-9)),
            "return_mean_20": s.get("return_mean_20"),
            "curve": make_curve(demo_output_points(proc.stdout))}


def summarize(runs: list[dict]) -> dict:
    solved = [r for r in runs if r["solved"]]
    return {"runs": runs, "solved": len(solved),
            "wall_s": median_range([r["wall_s"] for r in solved] or [0]),
            "env_steps": median_range([r["env_steps"] for r in solved] or [0]),
            "env_steps_per_s": median_range([r["env_steps_per_s"] for r in runs] or [0])}


def table_markdown(r: dict) -> str:
    lines = [f"| CartPole-v1 to mean return {r['target']:g} | solved | wall time | env steps | "
             "env steps/s |", "| --- | --- | --- | --- | --- |"]
    for name, s in r["algorithms"].items():
        w, e, v = s["wall_s"], s["env_steps"], s["env_steps_per_s"]
        lines.append(f"| {name} | {s['solved']}/{len(s['runs'])} | {w['median']:.1f} s "
                     f"({w['min']:.1f} – {w['max']:.1f}) | {e['median']:,.0f} | {v['median']:,.0f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="seeds per algorithm")
    ap.add_argument("--target", type=float, default=450.0, help="mean return of the last 20 episodes")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="give up a run after this long")
    ap.add_argument("--quick", action="store_true", help="one seed, a 150 target")
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS),
                    help="comma-separated subset of " + ", ".join(ALGORITHMS))
    ap.add_argument("--transport", default="tcp", choices=("tcp", "shm"), help="the demo clients' transport")
    ap.add_argument("--num-envs", type=int, default=1, help="env copies each demo client steps (vectorized)")
    ap.add_argument("--out", help="result file (default: bench/results/offpolicy.json)")
    args = ap.parse_args()
    runs = 1 if args.quick else args.runs
    target = 150.0 if args.quick else args.target
    chosen = [name for name in args.algorithms.split(",") if name]
    unknown = sorted(set(chosen) - set(ALGORITHMS))
    if unknown:
        ap.error(f"unknown algorithms {unknown} (known: {', '.join(ALGORITHMS)})")
    results: dict[str, list] = {name: [] for name in chosen}
    for seed in range(runs):
        for name in chosen:
            results[name].append(solve_run(name, seed, target, args.timeout_s, args.transport, args.num_envs))
            print(name, results[name][-1], flush=True)
    result = {"target": target, "transport": args.transport, "num_envs": args.num_envs,
              "algorithms": {n: summarize(r) for n, r in results.items()}}
    path = write_result("offpolicy", result, args.out)
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    print(table_markdown(result))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
