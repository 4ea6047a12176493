"""PPO on LunarLander-v3: greedy return after a budget of env steps.

    python -m bench.scenarios.lunar [--runs 3] [--steps 1000000] [--settings NAME] [--quick]
                                    [--out FILE]

Per seed: ``rlinkd serve`` (``env.id = LunarLander-v3``, PPO with the named settings) and
``--clients`` ``rlinkd client`` processes of ``--num-envs`` env copies each over shared memory,
until the daemon has ingested ``--steps`` env steps; then the clients stop and an evaluation
client (greedy, ``mode="evaluate"``) plays ``--eval-episodes`` episodes on envs seeded
seed+1000, ... The curve is the daemon's mean return of the last 20 episodes, polled.
Needs the bench extra (gymnasium[box2d]). Writes bench/results/lunar.json.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.harness.common import median_range, write_result
from bench.harness.curves import make_curve
from bench.scenarios.sac_pendulum import evaluate
from rlinkd.daemon.launch import ServeProcess, kill_pids, rlinkd_command, set_args

ENV_ID = "LunarLander-v3"
SETTINGS = {
    "defaults": [],
    # rl-baselines3-zoo's LunarLander PPO (gamma 0.999, lambda 0.98, 4 epochs, entropy 0.01,
    # lr 3e-4, 16,384-step batches: two clients of 8,192 steps a sample, on-policy) with
    # 256-row minibatches (the zoo's 64 quadruples the gradient steps for little gain here)
    "zoo": ["ppo.gamma=0.999", "ppo.gae_lambda=0.98", "ppo.num_epochs=4", "ppo.ent_coef=0.01",
            "ppo.lr=0.0003", "ppo.minibatch_size=256", "sampling.train_batch_size=16384",
            "sampling.env_steps_per_sample=8192"],
    # trials: 4,096-step batches (two clients of 2,048 steps), more updates
    "b4k": ["ppo.gamma=0.999", "ppo.gae_lambda=0.98", "ppo.num_epochs=10", "ppo.ent_coef=0.01",
            "ppo.lr=0.0005", "ppo.minibatch_size=256", "sampling.train_batch_size=4096",
            "sampling.env_steps_per_sample=2048"],
    "b4k_lr1e3": ["ppo.gamma=0.999", "ppo.gae_lambda=0.98", "ppo.num_epochs=10", "ppo.ent_coef=0.01",
                  "ppo.lr=0.001", "ppo.minibatch_size=256", "sampling.train_batch_size=4096",
                  "sampling.env_steps_per_sample=2048"],
    "b4k_g99": ["ppo.gamma=0.99", "ppo.gae_lambda=0.95", "ppo.num_epochs=10", "ppo.ent_coef=0.01",
                "ppo.lr=0.001", "ppo.minibatch_size=256", "sampling.train_batch_size=4096",
                "sampling.env_steps_per_sample=2048"],
    # best: gamma 0.99 / lambda 0.95, lr 1e-3, 10 epochs of 256-row minibatches, entropy 0.01,
    # observation normalisation, 4,096-step batches (~430 updates per 1M steps)
    "b4k_g99_norm": ["ppo.gamma=0.99", "ppo.gae_lambda=0.95", "ppo.num_epochs=10", "ppo.ent_coef=0.01",
                     "ppo.lr=0.001", "ppo.minibatch_size=256", "ppo.normalize_observations=true",
                     "sampling.train_batch_size=4096", "sampling.env_steps_per_sample=2048"],
}
POLL_S = 2.0


def lunar_run(seed: int, steps: int, clients: int, num_envs: int, eval_episodes: int,
              overrides: list[str]) -> dict:
    state = Path(tempfile.mkdtemp(prefix="rlinkd-lunar-"))
    daemon = ServeProcess(state, set_args([f"env.id={ENV_ID}", f"learner.seed={seed}", *overrides]))
    procs: list[subprocess.Popen] = []
    try:
        daemon.start()
        t0 = time.monotonic()
        procs = [subprocess.Popen(rlinkd_command("client", "--env", ENV_ID, "--connect", "shm",
                                                 "--state-dir", str(state), "--num-envs", str(num_envs),
                                                 "--seed", str(100 * seed + i)),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for i in range(clients)]
        points, status = [], daemon.status()
        while status.get("env_steps", 0) < steps:
            time.sleep(POLL_S)
            status = daemon.status()
            points.append((time.monotonic() - t0, status.get("env_steps", 0),
                           status.get("episode_return_mean_20")))
        wall = time.monotonic() - t0
        for p in procs:
            p.terminate()
            p.wait(30)
        greedy = evaluate(f"shm:{state}", seed, eval_episodes, ENV_ID)
    finally:
        kill_pids(p.pid for p in procs if p.poll() is None)
        daemon.stop()
        shutil.rmtree(state, ignore_errors=True)
    return {"seed": seed, "env_steps": status.get("env_steps"), "wall_s": round(wall, 1),
            "updates": (status.get("learner") or {}).get("updates"),
            "greedy_return_mean": round(float(np.mean(greedy)), 1),
            "greedy_return_std": round(float(np.std(greedy)), 1), "curve": make_curve(points)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="seeds")
    ap.add_argument("--steps", type=int, default=1_000_000, help="env steps of training per run")
    ap.add_argument("--clients", type=int, default=2, help="client processes")
    ap.add_argument("--num-envs", type=int, default=8, help="env copies per client process")
    ap.add_argument("--eval-episodes", type=int, default=10, help="greedy episodes after training")
    ap.add_argument("--target", type=float, default=200.0, help="greedy return to reach")
    ap.add_argument("--settings", default="b4k_g99_norm", choices=sorted(SETTINGS),
                    help="PPO settings (see SETTINGS)")
    ap.add_argument("--quick", action="store_true", help="one seed, 50,000 steps, 2 greedy episodes")
    ap.add_argument("--out", help="result file (default: bench/results/lunar.json)")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.steps, args.eval_episodes = 1, 50_000, 2
    runs = []
    for seed in range(args.runs):
        runs.append(lunar_run(seed, args.steps, args.clients, args.num_envs, args.eval_episodes,
                              SETTINGS[args.settings]))
        print({k: v for k, v in runs[-1].items() if k != "curve"}, flush=True)
    summary = {"runs": runs, "wall_s": median_range([r["wall_s"] for r in runs]),
               "greedy_return": median_range([r["greedy_return_mean"] for r in runs]),
               "reached_target": sum(r["greedy_return_mean"] >= args.target for r in runs)}
    result = {"env": ENV_ID, "steps": args.steps, "target": args.target, "settings": args.settings,
              "overrides": SETTINGS[args.settings], "systems": {f"rlinkd PPO ({args.settings})": summary}}
    path = write_result("lunar", result, args.out)
    g, w = summary["greedy_return"], summary["wall_s"]
    print(f"greedy return median {g['median']:.0f} ({g['min']:.0f} – {g['max']:.0f}), "
          f"{summary['reached_target']}/{len(runs)} >= {args.target:g}; wall {w['median']:.0f} s")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
