"""A CartPole client for the client-side solve criterion: one JSON line per episode.

    python -m bench.scenarios.solve_client --connect tcp://127.0.0.1:P|shm:<state_dir> [--seed S]
                                           [--env GYM_ID]

Runs ``client_lib.run_env`` (the library every rlinkd client uses; no torch) until SIGTERM
and prints ``{"t": <CLOCK_MONOTONIC s>, "ret": <episode return>, "steps": <client steps>}``
after every complete episode, so the benchmark can pool episodes of several clients in
time order and stop when the mean of the last 100 reaches 450. ``--env`` (default
CartPole-v1) runs another gymnasium id the same way (``minatar`` uses it for MinAtar).
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connect", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--env", default="CartPole-v1", help="gymnasium id")
    args = ap.parse_args()
    import gymnasium as gym
    from rlinkd.client_lib.runner import run_env
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # unwind: run_env closes the agent

    def on_episode(stats, episode_return: float) -> None:
        print(json.dumps({"t": time.monotonic(), "ret": episode_return, "steps": stats.steps}), flush=True)

    print(json.dumps({"event": "start", "t": time.monotonic()}), flush=True)
    run_env(gym.make(args.env), args.connect, seed=args.seed, on_episode=on_episode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
