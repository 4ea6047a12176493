"""Stable-Baselines3 DQN on CartPole-v1: the SB3 peer of the "DQN on CartPole-v1, 50,000 env
steps" benchmark.

Hyperparameters are rl-baselines3-zoo's for CartPole-v1 DQN (hyperparams/dqn.yml): lr 2.3e-3,
batch 64, buffer 100,000, 1,000 steps before learning, gamma 0.99, target copied every 10 env
steps, 128 gradient steps every 256 env steps, epsilon from 1 to 0.04 over the first 16% of
the budget, a 256x256 Q-network; SB3's defaults for the rest (Huber loss, gradient-norm clip
10, Adam, no double Q). Run it with the python of a venv that has stable-baselines3,
gymnasium, numpy and torch (not rlinkd), from the repo root:

    VENV/bin/python bench/peers/sb3_dqn_cartpole.py --seed 0 [--steps 50000] \
        [--eval-episodes 10] [--threads 1]

It trains, records a learning curve (one point per finished training episode: wall seconds
since training start, env steps so far, mean return of the last 10 training episodes), then
plays the greedy policy on a fresh env seeded seed+1000, seed+1001, ... and prints ONE JSON
line on stdout. Everything else goes to stderr.
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
from stable_baselines3 import DQN
from stable_baselines3.common.callbacks import BaseCallback

ENV_ID = "CartPole-v1"
MAX_CURVE_POINTS = 300
ZOO = dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000,
           gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
           exploration_fraction=0.16, exploration_final_eps=0.04,
           policy_kwargs=dict(net_arch=[256, 256]))


class Curve(BaseCallback):
    """(wall_s, env_steps, mean of the last 10 training returns) at each finished episode."""

    def __init__(self) -> None:
        super().__init__()
        self.t0 = 0.0
        self.last10: collections.deque[float] = collections.deque(maxlen=10)
        self.points: dict[str, list[float]] = {"wall_s": [], "env_steps": [], "return_mean": []}

    def _on_training_start(self) -> None:
        self.t0 = time.perf_counter()

    def _on_step(self) -> bool:
        for info in self.locals.get("infos", []):
            episode = info.get("episode")  # the Monitor wrapper's summary of a finished episode
            if episode is not None:
                self.last10.append(float(episode["r"]))
                self.points["wall_s"].append(round(time.perf_counter() - self.t0, 4))
                self.points["env_steps"].append(int(self.num_timesteps))
                self.points["return_mean"].append(round(float(np.mean(self.last10)), 3))
        return True


def thinned(points: dict[str, list[float]], limit: int = MAX_CURVE_POINTS) -> dict[str, list[float]]:
    """At most `limit` evenly spaced points, the first and the last kept."""
    n = len(points["wall_s"])
    if n <= limit:
        return points
    keep = np.unique(np.linspace(0, n - 1, limit).round().astype(int))
    return {k: [v[i] for i in keep] for k, v in points.items()}


def greedy_returns(model: DQN, seed: int, episodes: int) -> list[float]:
    """Returns of argmax-Q play on a fresh env, episode i seeded seed + 1000 + i."""
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
        out.append(total)
    env.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0, help="seed of DQN, the env and (+1000) the greedy episodes")
    p.add_argument("--steps", type=int, default=50_000, help="env steps of training")
    p.add_argument("--eval-episodes", type=int, default=10, help="greedy episodes after training")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads value")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the one JSON line only
        model = DQN("MlpPolicy", gym.make(ENV_ID), seed=args.seed, verbose=0, **ZOO)
        curve = Curve()
        t0 = time.perf_counter()
        model.learn(total_timesteps=args.steps, callback=curve)
        train_wall_s = time.perf_counter() - t0
        returns = greedy_returns(model, args.seed, args.eval_episodes)
    print(json.dumps({
        "system": "sb3", "version": stable_baselines3.__version__, "algorithm": "dqn",
        "seed": args.seed, "steps": args.steps, "train_wall_s": round(train_wall_s, 3),
        "greedy_returns": returns, "greedy_return_mean": float(np.mean(returns)),
        "greedy_return_std": float(np.std(returns)), "curve": thinned(curve.points),
    }), flush=True)


if __name__ == "__main__":
    main()
