"""Stable-Baselines3 SAC on Pendulum-v1: the SB3 peer of the "SAC on Pendulum-v1" benchmark.

Hyperparameters are rl-baselines3-zoo's for Pendulum-v1 SAC: learning_rate=1e-3 and SB3's
defaults for everything else. Run it with the python of a venv that has stable-baselines3,
gymnasium, numpy and torch (not rlinkd), from the repo root:

    VENV/bin/python bench/peers/sb3_sac_pendulum.py --seed 0 --steps 20000 \
        [--lr 1e-3] [--eval-episodes 10] [--threads 1]

It trains, records a learning curve (one point per finished training episode: wall seconds
since training start, env steps so far, mean return of the last 10 training episodes), then
evaluates the greedy policy on a fresh env seeded seed+1000, seed+1001, ... and prints ONE
JSON line on stdout. Everything else goes to stderr.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sys
import time

import gymnasium as gym
import numpy as np
import stable_baselines3
import torch
from stable_baselines3 import SAC
from stable_baselines3.common.callbacks import BaseCallback

ENV_ID = "Pendulum-v1"
MAX_CURVE_POINTS = 300


class CurveCallback(BaseCallback):
    """Appends (wall_s, env_steps, mean of last 10 returns) at every finished training episode."""

    def __init__(self) -> None:
        super().__init__()
        self.t0 = 0.0
        self.recent: collections.deque[float] = collections.deque(maxlen=10)
        self.curve: dict[str, list[float]] = {"wall_s": [], "env_steps": [], "return_mean": []}

    def _on_training_start(self) -> None:
        self.t0 = time.perf_counter()

    def _on_step(self) -> bool:
        for info in self.locals.get("infos", []):
            if "episode" in info:  # set by the Monitor wrapper SB3 adds when an episode ends
                self.recent.append(float(info["episode"]["r"]))
                self.curve["wall_s"].append(round(time.perf_counter() - self.t0, 4))
                self.curve["env_steps"].append(int(self.num_timesteps))
                self.curve["return_mean"].append(round(float(np.mean(self.recent)), 3))
        return True


def thin(curve: dict[str, list[float]], limit: int = MAX_CURVE_POINTS) -> dict[str, list[float]]:
    """At most `limit` evenly spaced points, always keeping the first and the last."""
    n = len(curve["wall_s"])
    if n <= limit:
        return curve
    keep = sorted({int(i) for i in np.linspace(0, n - 1, limit).round()})
    return {k: [v[i] for i in keep] for k, v in curve.items()}


def evaluate(model: SAC, seed: int, episodes: int) -> list[float]:
    """Returns of the deterministic policy on a fresh env, episode i seeded seed + 1000 + i."""
    env = gym.make(ENV_ID)
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + 1000 + i)
        total, done = 0.0, False
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0, help="seed for SAC, the training env and (plus 1000) eval")
    p.add_argument("--steps", type=int, default=20000, help="total env steps to train for")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate (rl-zoo Pendulum-v1: 1e-3)")
    p.add_argument("--eval-episodes", type=int, default=10, help="greedy evaluation episodes after training")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads value")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    with contextlib.redirect_stdout(sys.stderr):  # keep stdout for the one JSON line
        model = SAC("MlpPolicy", gym.make(ENV_ID), learning_rate=args.lr, seed=args.seed, verbose=0)
        callback = CurveCallback()
        t0 = time.perf_counter()
        model.learn(total_timesteps=args.steps, callback=callback)
        train_wall_s = time.perf_counter() - t0
        returns = evaluate(model, args.seed, args.eval_episodes)
    result = {
        "system": "sb3", "version": stable_baselines3.__version__,
        "seed": args.seed, "steps": args.steps, "train_wall_s": round(train_wall_s, 3),
        "greedy_return_mean": float(np.mean(returns)), "greedy_return_std": float(np.std(returns)),
        "curve": thin(callback.curve),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
