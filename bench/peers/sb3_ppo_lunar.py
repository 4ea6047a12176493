"""Stable-Baselines3 PPO on LunarLander-v3: the SB3 peer of bench/scenarios/lunar.py (1,000,000 env steps).

Hyperparameters are rl-baselines3-zoo's for LunarLander PPO (hyperparams/ppo.yml): 16 envs
(a DummyVecEnv, one process) of 1,024 steps a rollout (16,384-step batches), minibatches of
64, 4 epochs, gamma 0.999, GAE lambda 0.98, entropy 0.01; SB3's defaults for the rest (lr
3e-4, clip 0.2, value coefficient 0.5, gradient-norm clip 0.5, 64x64 tanh MLPs, advantages
normalised per minibatch, no observation normalisation). SB3 collects whole rollouts, so it
stops at the first multiple of 16,384 steps at or past the budget (1,015,808 for 1e6).
Run it with the python of a venv that has stable-baselines3, gymnasium[box2d], numpy and
torch (not rlinkd), from the repo root, one seed at a time:

    OMP_NUM_THREADS=1 VENV/bin/python bench/peers/sb3_ppo_lunar.py --seed 0 [--steps 1000000] \
        [--eval-episodes 10] [--threads 1] [--out bench/results/lunar_sb3.json]

It trains, records a learning curve (one point per finished training episode of any of the
16 envs: wall seconds since training start, env steps so far, mean return of the last 20
finished training episodes, as rlinkd's daemon reports it), then plays the greedy (argmax)
policy on a fresh env seeded seed+1000, seed+1001, ... and prints ONE JSON line on stdout;
everything else goes to stderr. With ``--out`` the run is also merged into that result file
(a run of the same seed replaced, the summary over its runs recomputed), so seeds run one
after another build one document that bench/report/plots.py draws beside lunar.json.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import stable_baselines3
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

ENV_ID = "LunarLander-v3"
MAX_CURVE_POINTS = 300
WINDOW = 20  # episodes in the curve's running mean (rlinkd's episode_return_mean_20)
N_ENVS = 16
ZOO = dict(n_steps=1024, batch_size=64, gae_lambda=0.98, gamma=0.999, n_epochs=4, ent_coef=0.01)
SYSTEM = f"SB3 {stable_baselines3.__version__} PPO (rl-baselines3-zoo LunarLander)"


class Curve(BaseCallback):
    """(wall_s, env_steps, mean of the last 20 training returns) at each finished episode."""

    def __init__(self) -> None:
        super().__init__()
        self.t0 = 0.0
        self.recent: collections.deque[float] = collections.deque(maxlen=WINDOW)
        self.points: dict[str, list[float]] = {"wall_s": [], "env_steps": [], "return_mean": []}

    def _on_training_start(self) -> None:
        self.t0 = time.perf_counter()

    def _on_step(self) -> bool:
        for info in self.locals.get("infos", []):
            episode = info.get("episode")  # the Monitor wrapper's summary of a finished episode
            if episode is not None:
                self.recent.append(float(episode["r"]))
                self.points["wall_s"].append(round(time.perf_counter() - self.t0, 3))
                self.points["env_steps"].append(int(self.num_timesteps))
                self.points["return_mean"].append(round(float(np.mean(self.recent)), 2))
        return True


def thinned(points: dict[str, list[float]], limit: int = MAX_CURVE_POINTS) -> dict[str, list[float]]:
    """At most `limit` evenly spaced points, the first and the last kept."""
    n = len(points["wall_s"])
    if n <= limit:
        return points
    keep = np.unique(np.linspace(0, n - 1, limit).round().astype(int))
    return {k: [v[i] for i in keep] for k, v in points.items()}


def first_reach(points: dict[str, list[float]], target: float) -> tuple[int | None, float | None]:
    """(env steps, wall s) of the first full-window mean at or above `target` (None, None: never)."""
    for i, value in enumerate(points["return_mean"]):
        if i + 1 >= WINDOW and value >= target:
            return int(points["env_steps"][i]), float(points["wall_s"][i])
    return None, None


def greedy_returns(model: PPO, seed: int, episodes: int) -> list[float]:
    """Returns of argmax-action play on a fresh env, episode i seeded seed + 1000 + i."""
    env = gym.make(ENV_ID)
    out = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + 1000 + i)
        total, done = 0.0, False
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        out.append(round(total, 2))
    env.close()
    return out


def command_line() -> str:
    """This process's command as it could be typed again: the thread and CPU limits it ran
    under (OMP_NUM_THREADS, CPU affinity, niceness) before the interpreter and its arguments."""
    prefix = []
    if "OMP_NUM_THREADS" in os.environ:
        prefix.append(f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < (os.cpu_count() or len(cpus)):
        prefix += ["taskset", "-c", ",".join(map(str, cpus))]
    if (niceness := os.nice(0)) > 0:
        prefix += ["nice", "-n", str(niceness)]
    return " ".join([*prefix, shlex.join([sys.executable, *sys.argv])])


def summary(runs: list[dict], target: float) -> dict:
    """Median and range over the runs, as the scenarios' ``median_range`` writes them."""
    def median_range(values: list[float]) -> dict:
        return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
                "max": round(max(values), 3), "n": len(values)}
    return {"runs": runs, "train_wall_s": median_range([r["train_wall_s"] for r in runs]),
            "greedy_return": median_range([r["greedy_return_mean"] for r in runs]),
            "reached_target": sum(r["greedy_return_mean"] >= target for r in runs)}


def merge_into(path: Path, run: dict, target: float) -> None:
    """Put `run` into the result document at `path` (replacing a run of the same seed)."""
    doc = json.loads(path.read_text()) if path.exists() else {}
    runs = [r for r in ((doc.get("systems") or {}).get(SYSTEM) or {}).get("runs", []) if r["seed"] != run["seed"]]
    runs = sorted([*runs, run], key=lambda r: r["seed"])
    doc = {
        "command": "; ".join(dict.fromkeys(r["command"] for r in runs)),
        "cpu_count": os.cpu_count(),
        "measured_at": ", ".join(f"seed {r['seed']}: {r['measured_at']}" for r in runs),
        "env": ENV_ID, "steps": run["steps"], "target": target, "n_envs": N_ENVS,
        "hyperparameters": ZOO, "gymnasium": gym.__version__, "torch": torch.__version__,
        "systems": {SYSTEM: summary(runs, target)},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
    print(f"wrote {path}", file=sys.stderr)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0, help="seed of PPO, the training envs and (+1000) the greedy episodes")
    p.add_argument("--steps", type=int, default=1_000_000, help="env steps of training (rounded up to whole rollouts)")
    p.add_argument("--eval-episodes", type=int, default=10, help="greedy episodes after training")
    p.add_argument("--target", type=float, default=200.0, help="return counted as solved (greedy and curve)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads value")
    p.add_argument("--out", type=Path, help="result file to merge this run into (e.g. bench/results/lunar_sb3.json)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the one JSON line only
        env = make_vec_env(ENV_ID, n_envs=N_ENVS, seed=args.seed)
        model = PPO("MlpPolicy", env, seed=args.seed, verbose=0, device="cpu", **ZOO)
        curve = Curve()
        t0 = time.perf_counter()
        model.learn(total_timesteps=args.steps, callback=curve)
        train_wall_s = time.perf_counter() - t0
        returns = greedy_returns(model, args.seed, args.eval_episodes)
    reach_steps, reach_wall = first_reach(curve.points, args.target)
    run = {
        "system": "sb3", "version": stable_baselines3.__version__, "algorithm": "ppo",
        "seed": args.seed, "steps": args.steps, "env_steps": int(model.num_timesteps),
        "iterations": int(model.num_timesteps) // (N_ENVS * ZOO["n_steps"]), "train_wall_s": round(train_wall_s, 1),
        "greedy_returns": returns, "greedy_return_mean": round(float(np.mean(returns)), 1),
        "greedy_return_std": round(float(np.std(returns)), 1),
        "episodes": len(curve.points["env_steps"]),
        "mean20_first_at_target": {"env_steps": reach_steps, "wall_s": reach_wall},
        "command": command_line(), "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2), "curve": thinned(curve.points),
    }
    print(json.dumps(run), flush=True)
    if args.out:
        merge_into(args.out, run, args.target)


if __name__ == "__main__":
    main()
