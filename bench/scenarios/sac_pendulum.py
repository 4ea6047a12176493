"""SAC on Pendulum-v1: rlinkd against Stable-Baselines3, same budget, same machine, one run.

    SB3_PYTHON=VENV/bin/python python -m bench.scenarios.sac_pendulum [--runs 3] [--steps 20000]
                                           [--settings NAME] [--quick] [--out FILE]

Per seed, alternating: (1) ``rlinkd serve`` with ``learner.algorithm = "sac"`` and one
client_lib Pendulum client over shared memory playing exactly ``--steps`` env steps (the
learner trains while it plays; ``sac.max_lead_steps`` holds the client when the learner is
more than that many env steps behind one update per step, so the budget buys the same
number of updates as SB3's); then an evaluation client (``mode="evaluate"``, greedy) plays
``--eval-episodes`` episodes on envs seeded seed+1000, seed+1001, ... (2) the SB3 peer
(bench/peers/sb3_sac_pendulum.py, rl-baselines3-zoo's Pendulum settings) in its own venv
with the same budget (its venv: ``python3 -m venv VENV && VENV/bin/pip install torch==2.13.0
stable-baselines3 gymnasium``; without SB3_PYTHON or ``--sb3-python`` the peer is skipped).
Training wall time: rlinkd from the client's first step to its last
(daemon start-up reported apart), SB3 its ``learn()`` call. Writes
bench/results/sac_pendulum.json; the curves are drawn by bench.report.plots.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from collections import deque
from pathlib import Path

import numpy as np
import orjson

from bench.harness.common import median_range, write_result
from bench.harness.curves import make_curve
from rlinkd.daemon.launch import ServeProcess, set_args

ENV_ID = "Pendulum-v1"
PEER = Path(__file__).resolve().parents[1] / "peers" / "sb3_sac_pendulum.py"
SETTINGS = {
    # rl-baselines3-zoo's lr; 64x64 networks (Pendulum needs no more; 256x256, SB3's, costs
    # ~3x the CPU per update here); the client held 200 env steps ahead of the learner at most
    "default": ["sac.lr=0.001", "sac.hidden_sizes=[64, 64]", "sac.learning_starts_steps=100",
                "sac.max_lead_steps=200"],
    "sb3-nets": ["sac.lr=0.001", "sac.learning_starts_steps=100", "sac.max_lead_steps=200"],
}


def rlinkd_run(seed: int, steps: int, eval_episodes: int, overrides: list[str],
               env_id: str = ENV_ID, algorithm: str = "sac") -> dict:
    """One daemon, one shared-memory client playing ``steps`` env steps of ``env_id`` while
    ``algorithm`` trains, then the greedy evaluation; the run's figures and curve."""
    state = Path(tempfile.mkdtemp(prefix="rlinkd-budget-"))
    started = time.monotonic()
    daemon = ServeProcess(state, set_args([f"env.id={env_id}", f"learner.algorithm={algorithm}",
                                           f"learner.seed={seed}", *overrides]))
    try:
        daemon.start()
        startup_s = time.monotonic() - started
        wall_s, curve = play(f"shm:{state}", seed, steps, env_id)
        learner = daemon.status()["learner"]
        greedy = evaluate(f"shm:{state}", seed, eval_episodes, env_id)
    finally:
        daemon.stop()
        shutil.rmtree(state, ignore_errors=True)
    return {"system": "rlinkd", "seed": seed, "steps": steps, "train_wall_s": round(wall_s, 2),
            "startup_s": round(startup_s, 2), "updates": learner.get("updates"),
            "greedy_return_mean": round(float(np.mean(greedy)), 1),
            "greedy_return_std": round(float(np.std(greedy)), 1), "curve": curve}


def play(address: str, seed: int, steps: int, env_id: str = ENV_ID) -> tuple[float, dict]:
    """``steps`` training steps with one client; (wall seconds, the learning curve)."""
    import gymnasium as gym
    from rlinkd.client_lib import connect
    agent, env = connect(address), gym.make(env_id)
    obs, _ = env.reset(seed=seed)
    recent, points, total = deque(maxlen=10), [], 0.0
    t0 = time.monotonic()
    for step in range(1, steps + 1):
        obs, reward, terminated, truncated, _ = env.step(agent.act(obs))
        agent.step(reward, obs, terminated, truncated)
        total += float(reward)
        if terminated or truncated:
            recent.append(total)
            points.append((time.monotonic() - t0, step, float(np.mean(recent))))
            total, (obs, _) = 0.0, env.reset()
    wall = time.monotonic() - t0
    agent.close()
    return wall, make_curve(points)


def evaluate(address: str, seed: int, episodes: int, env_id: str = ENV_ID) -> list[float]:
    """Greedy returns of the newest weights (an evaluation client: nothing it plays trains)."""
    import gymnasium as gym
    from rlinkd.client_lib import connect
    agent, env, returns = connect(address, mode="evaluate"), gym.make(env_id), []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + 1000 + i)
        done, total = False, 0.0
        while not done:
            obs, reward, terminated, truncated, _ = env.step(agent.act(obs))
            agent.step(reward, obs, terminated, truncated)
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    agent.close()
    return returns


def sb3_run(python: str, seed: int, steps: int, eval_episodes: int) -> dict:
    """The SB3 peer in its own interpreter; its one JSON line."""
    cmd = [python, str(PEER), "--seed", str(seed), "--steps", str(steps),
           "--eval-episodes", str(eval_episodes)]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True,
                         timeout=3600).stdout
    return orjson.loads(out.strip().splitlines()[-1])


def summarize(runs: list[dict], target: float) -> dict:
    return {"runs": runs, "train_wall_s": median_range([r["train_wall_s"] for r in runs]),
            "greedy_return": median_range([r["greedy_return_mean"] for r in runs]),
            "reached_target": sum(r["greedy_return_mean"] >= target for r in runs)}


def table_markdown(r: dict) -> str:
    lines = [f"| Pendulum-v1, {r['steps']:,} env steps | training wall time | greedy return "
             f"(10 episodes) | runs >= {r['target']:g} |", "| --- | --- | --- | --- |"]
    for name, s in r["systems"].items():
        w, g = s["train_wall_s"], s["greedy_return"]
        lines.append(f"| {name} | {w['median']:.1f} s ({w['min']:.1f} – {w['max']:.1f}) | "
                     f"{g['median']:.0f} ({g['min']:.0f} – {g['max']:.0f}) | "
                     f"{s['reached_target']}/{len(s['runs'])} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="seeds per system")
    ap.add_argument("--steps", type=int, default=20_000, help="env steps of training per run")
    ap.add_argument("--eval-episodes", type=int, default=10, help="greedy episodes after training")
    ap.add_argument("--target", type=float, default=-200.0, help="greedy return to reach")
    ap.add_argument("--settings", default="default", choices=sorted(SETTINGS),
                    help="rlinkd's [sac] settings (see SETTINGS)")
    ap.add_argument("--sb3-python", default=os.environ.get("SB3_PYTHON", ""),
                    help="python of a venv with stable-baselines3 (default: $SB3_PYTHON; "
                         "empty: skip the peer)")
    ap.add_argument("--quick", action="store_true", help="one seed, 2,000 steps, 2 greedy episodes")
    ap.add_argument("--out", help="result file (default: bench/results/sac_pendulum.json)")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.steps, args.eval_episodes = 1, 2000, 2
    runs: dict[str, list[dict]] = {"rlinkd": [], **({"sb3": []} if args.sb3_python else {})}
    for seed in range(args.runs):
        runs["rlinkd"].append(rlinkd_run(seed, args.steps, args.eval_episodes, SETTINGS[args.settings]))
        if args.sb3_python:
            runs["sb3"].append(sb3_run(args.sb3_python, seed, args.steps, args.eval_episodes))
        for name, done in runs.items():
            print(name, {k: v for k, v in done[-1].items() if k != "curve"}, flush=True)
    result = {"env": ENV_ID, "steps": args.steps, "target": args.target, "settings": args.settings,
              "overrides": SETTINGS[args.settings],
              "systems": {name: summarize(r, args.target) for name, r in runs.items()}}
    path = write_result("sac_pendulum", result, args.out)
    print(table_markdown(result))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
