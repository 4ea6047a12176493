"""``rlinkd client``: a gymnasium env driven through client_lib (no torch imported)."""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time


def resolve_connect(address: str, state_dir: str | None) -> str:
    """``shm``/``auto`` are resolved by client_lib from the daemon's state dir."""
    if address in ("shm", "auto") and state_dir:
        return f"{address}:{state_dir}"
    return address


def run_client(args: argparse.Namespace) -> int:
    import gymnasium as gym
    from rlinkd.client_lib.runner import run_env
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # unwind: run_env closes the agent
    if args.num_envs < 1:
        print("rlinkd client: --num-envs must be at least 1", file=sys.stderr)
        return 64
    env = (gym.make(args.env) if args.num_envs == 1 else
           gym.make_vec(args.env, num_envs=args.num_envs, vectorization_mode="sync"))
    next_report = [time.monotonic() + args.report_every_s]

    def on_episode(stats, episode_return: float) -> None:
        if time.monotonic() >= next_report[0]:
            next_report[0] = time.monotonic() + args.report_every_s
            print(json.dumps(_progress(stats)), flush=True)

    stats = run_env(env, resolve_connect(args.connect, args.state_dir), steps=args.steps,
                    episodes=args.episodes, explore=not args.greedy, seed=args.seed,
                    token=args.token, on_episode=on_episode, **served(args))
    print(json.dumps(dict(_progress(stats), event="done")), flush=True)
    return 0


def served(args: argparse.Namespace) -> dict:
    """connect() / connect_vector() keywords for ``--inference server``."""
    return {"inference": "server"} if args.inference == "server" else {}


def _progress(stats) -> dict:
    mean = stats.mean_return()
    return {"event": "progress", "steps": stats.steps, "episodes": stats.episodes,
            "return_mean_100": None if mean is None else round(mean, 2),
            "steps_per_s": round(stats.steps / max(stats.elapsed_s, 1e-9), 1)}
