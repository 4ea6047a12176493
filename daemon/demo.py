"""``rlinkd demo``: a daemon plus N local CartPole clients, with a progress line, until solved.

Starts ``rlinkd serve`` (its logs go to ``<state_dir>/rlinkd.log``) and N ``rlinkd
client`` processes, polls the daemon's status once a second, prints steps, steps/s,
mean return of the last 20 episodes and weights_seq_no, and exits 0 once that mean
reaches the target (default 450); everything it started is stopped by pid.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

from rlinkd.daemon.errors import ExitCode
from rlinkd.daemon.launch import ServeProcess, rlinkd_command, set_args, stop_processes
from rlinkd.daemon.runfiles import query_status

POLL_S = 1.0


def start_daemon(state_dir: Path, overrides: list[str], seed: int = 0) -> ServeProcess:
    """Launch ``rlinkd serve`` (fresh state, learner seed); does not wait for it."""
    args = ["--fresh", "--set", f"learner.seed={seed}", *set_args(overrides)]
    return ServeProcess(state_dir, args).launch()


def client_address(i: int, transport: str, info: dict, state_dir: Path) -> str:
    use_shm = transport == "shm" or (transport == "mixed" and i % 2 == 1)
    return f"shm:{state_dir}" if use_shm else f"tcp://127.0.0.1:{info['port']}"


def start_clients(n: int, transport: str, info: dict, state_dir: Path,
                  seed: int = 0, num_envs: int = 1, inference: str = "client") -> list[subprocess.Popen]:
    with open(state_dir / "clients.log", "ab") as out:  # each child keeps its own copy of the fd
        return [subprocess.Popen(rlinkd_command("client", "--env", "CartPole-v1",
                                                "--seed", str(1000 + 100 * seed + i),
                                                "--num-envs", str(num_envs),
                                                "--inference", inference,
                                                "--connect", client_address(i, transport, info, state_dir)),
                                 stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                for i in range(n)]


def progress_line(t: float, s: dict) -> str:
    ret = s.get("episode_return_mean_20")
    return (f"[{t:6.1f}s] steps {s.get('env_steps', 0):>8,}  {s.get('env_steps_per_s', 0):>8,.0f} steps/s"
            f"  mean return (last 20) {'-' if ret is None else f'{ret:6.1f}'}"
            f"  seq_no {s.get('weights_seq_no', -1):>4}  clients {s.get('clients', 0)}")


def watch(args: argparse.Namespace, info: dict, t0: float) -> tuple[bool, dict]:
    status: dict = {}
    while time.monotonic() - t0 < args.timeout_s:
        time.sleep(POLL_S)
        status = query_status(info)
        print(progress_line(time.monotonic() - t0, status), flush=True)
        ret = status.get("episode_return_mean_20")
        if ret is not None and status.get("episodes", 0) >= 20 and ret >= args.target:
            return True, status
    return False, status


def run_demo(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir or tempfile.mkdtemp(prefix="rlinkd-demo-")).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    print(f"rlinkd demo: {args.clients} {args.transport} client(s) on CartPole-v1; state and "
          f"logs in {state_dir}", flush=True)
    t0 = time.monotonic()
    daemon = start_daemon(state_dir, args.set, args.seed)
    clients: list[subprocess.Popen] = []
    try:
        info = daemon.wait_ready(120.0)
        clients = start_clients(args.clients, args.transport, info, state_dir, args.seed,
                                args.num_envs, args.inference)
        solved, status = watch(args, info, t0)
    finally:
        stop_processes(clients)
        exit_code = daemon.stop(30.0)
    wall = time.monotonic() - t0
    summary = {"solved": solved, "wall_s": round(wall, 1), "env_steps": status.get("env_steps"),
               "episodes": status.get("episodes"), "weights_seq_no": status.get("weights_seq_no"),
               "return_mean_20": status.get("episode_return_mean_20"),
               "daemon_exit": exit_code}
    print(("SOLVED " if solved else "NOT SOLVED ") + json.dumps(summary), flush=True)
    return 0 if solved and exit_code == 0 else int(ExitCode.CRASH)
