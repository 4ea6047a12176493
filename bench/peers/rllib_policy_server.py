"""RLlib's PolicyServerInput + PolicyClient(inference_mode="remote"), old API stack: the peer
of rlinkd's server-side actions. Run with the python of a ray 2.48 venv (the last releases
that ship PolicyServerInput; see ../shared/anchors/rllib/run_anchor.sh for how one is made):

    VENV/bin/python bench/peers/rllib_policy_server.py latency  [--n 2000]
    VENV/bin/python bench/peers/rllib_policy_server.py throughput [--clients 64 --seconds 8]
    VENV/bin/python bench/peers/rllib_policy_server.py solve [--clients 2 --timeout-s 900]

Each mode starts the server (PPO on CartPole-v1's spaces, inputs from PolicyServerInput on
127.0.0.1) in a child process and drives it with PolicyClient processes; prints one JSON
line. It imports ray and RLlib; it contains none of their code.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time

import numpy as np

OBS = np.array([0.01, 0.02, 0.03, 0.04], np.float32)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(port: int, train_batch_size: int) -> None:
    """The RLlib server: PPO whose only input is a PolicyServerInput (old API stack)."""
    import gymnasium as gym
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.env.policy_server_input import PolicyServerInput
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    config = (PPOConfig()
              .api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False)
              .environment(env=None, observation_space=gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
                           action_space=gym.spaces.Discrete(2))
              .offline_data(input_=lambda ioctx: PolicyServerInput(ioctx, "127.0.0.1", port))
              .env_runners(num_env_runners=0, enable_connectors=False)
              .training(train_batch_size=train_batch_size)
              .evaluation(off_policy_estimation_methods={})
              .reporting(min_sample_timesteps_per_iteration=train_batch_size))
    algo = config.build()
    while True:
        algo.train()


def start_server(train_batch_size: int) -> tuple[mp.Process, int]:
    port = free_port()
    proc = mp.get_context("spawn").Process(target=serve, args=(port, train_batch_size), daemon=True)
    proc.start()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("the RLlib policy server did not start listening within 240 s")


def client(port: int):
    from ray.rllib.env.policy_client import PolicyClient
    return PolicyClient(f"http://127.0.0.1:{port}", inference_mode="remote")


def latency(port: int, n: int) -> dict:
    c = client(port)
    eid = c.start_episode(training_enabled=False)
    c.get_action(eid, OBS)
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        c.log_returns(eid, 1.0)
        c.get_action(eid, OBS)
        lat.append(time.perf_counter() - t0)
    return {"p50_us": round(float(np.percentile(lat, 50)) * 1e6, 1),
            "p99_us": round(float(np.percentile(lat, 99)) * 1e6, 1)}


def _throughput_worker(port: int, secs: float, q, start) -> None:
    c = client(port)
    eid = c.start_episode(training_enabled=False)
    c.get_action(eid, OBS)
    start.wait()
    n, t_end = 0, time.perf_counter() + secs
    while time.perf_counter() < t_end:
        c.log_returns(eid, 1.0)
        c.get_action(eid, OBS)
        n += 1
    q.put(n)


def throughput(port: int, clients: int, secs: float) -> dict:
    ctx = mp.get_context("fork")
    q, start = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_throughput_worker, args=(port, secs, q, start)) for _ in range(clients)]
    for p in procs:
        p.start()
    time.sleep(5)
    start.set()
    total = sum(q.get(timeout=secs + 300) for _ in procs)
    for p in procs:
        p.join(30)
    return {"clients": clients, "actions_per_s": round(total / secs)}


def _solve_worker(port: int, seed: int, q, stop) -> None:
    import gymnasium as gym
    c = client(port)
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    eid, ret, steps = c.start_episode(), 0.0, 0
    while not stop.is_set():
        action = c.get_action(eid, obs)
        obs, r, term, trunc, _ = env.step(action)
        c.log_returns(eid, r)
        ret += r
        steps += 1
        if term or trunc:
            c.end_episode(eid, obs)
            q.put((ret, steps))
            obs, _ = env.reset()
            eid, ret, steps = c.start_episode(), 0.0, 0


def solve(port: int, clients: int, timeout_s: float, target: float) -> dict:
    ctx = mp.get_context("fork")
    q, stop = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_solve_worker, args=(port, 1000 + i, q, stop)) for i in range(clients)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    returns, steps = [], 0
    solved = False
    while time.monotonic() - t0 < timeout_s:
        try:
            ret, n = q.get(timeout=5)
        except Exception:  # noqa: BLE001 - queue.Empty: keep waiting until the timeout
            continue
        returns.append(ret)
        steps += n
        if len(returns) >= 20 and statistics.mean(returns[-20:]) >= target:
            solved = True
            break
    stop.set()
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
    return {"solved": solved, "wall_s": round(time.monotonic() - t0, 1), "env_steps": steps,
            "episodes": len(returns), "return_mean_20": round(statistics.mean(returns[-20:]), 1) if returns else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("latency", "throughput", "solve"))
    ap.add_argument("--n", type=int, default=2000, help="latency: round trips")
    ap.add_argument("--clients", type=int, default=64, help="throughput/solve: client processes")
    ap.add_argument("--seconds", type=float, default=8.0, help="throughput: seconds measured")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="solve: give up after")
    ap.add_argument("--target", type=float, default=450.0, help="solve: mean return of 20 episodes")
    ap.add_argument("--train-batch-size", type=int, default=4000)
    args = ap.parse_args()
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    import ray
    server, port = start_server(args.train_batch_size)
    try:
        if args.mode == "latency":
            out = latency(port, args.n)
        elif args.mode == "throughput":
            out = throughput(port, args.clients, args.seconds)
        else:
            out = solve(port, args.clients, args.timeout_s, args.target)
    finally:
        server.kill()
    print(json.dumps({"peer": f"ray {ray.__version__} PolicyServerInput + PolicyClient(remote)",
                      "mode": args.mode, **out}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
