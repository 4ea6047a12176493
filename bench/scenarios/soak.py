"""Soak: 64 TCP + 8 shared-memory CartPole clients against one daemon for a long time.

    python -m bench.scenarios.soak [--duration-s 600] [--tcp-clients 64] [--shm-clients 8]

Clients run as threads in a few worker processes (each worker: 8 TCP + 1 shm agent by
default). At the end the driver pauses every agent right after an acknowledged sample,
then compares per client: env steps the client had acknowledged ("sent") with the env
steps the daemon ingested for that connection (status ``sessions``); they must be equal.
Episodes dropped for policy lag are counted by the daemon (``dropped_episodes``) and
reported beside. The daemon tree's summed RSS is sampled every second; growth after the
warm-up (first 20% of the run) must stay within ``targets.SOAK_RSS_GROWTH`` (10 %). The daemon log must hold no
error-level lines. Writes bench/results/soak.json; exit status 0 when all checks pass.
"""
from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from rlinkd.daemon.launch import stop_processes

from bench.harness.common import REPO, client_load_parser, write_result
from bench.harness.daemon import Daemon
from bench.harness.proctree import TreeSampler
from bench.report.targets import SOAK_RSS_GROWTH


# ---------------------------------------------------------------- worker process
def run_worker(args: argparse.Namespace) -> int:
    """Worker mode: ``--worker OUT --tcp N --shm M``; runs agents until OUT.pause exists."""
    import gymnasium as gym
    from rlinkd.client_lib import connect
    out, pause = Path(args.worker), Path(args.worker + ".pause")
    agents, threads = [], []
    addresses = [args.tcp_address] * args.tcp + [f"shm:{args.state_dir}"] * args.shm
    for i, address in enumerate(addresses):
        agent = connect(address, reconnect_timeout_s=30, seed=args.seed * 100 + i)
        agents.append(agent)
        threads.append(threading.Thread(target=_agent_loop, args=(agent, gym.make("CartPole-v1"),
                                                                  pause), daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report = [{"key": a.link.session_key(), "transport": type(a.link).__name__,
               "steps_sent": a.steps_synced, "error": getattr(a, "soak_error", None)}
              for a in agents]
    out.write_text(json.dumps(report))
    signal.pause()  # keep the connections open until the driver has read the status
    return 0


def _agent_loop(agent, env, pause: Path) -> None:
    from rlinkd.client_lib.transport import RLlinkError
    obs, _ = env.reset()
    try:
        while True:
            action = agent.act(obs)
            obs, reward, terminated, truncated, _ = env.step(action)
            before = agent.steps_since_send
            agent.step(reward, obs, terminated, truncated)
            if terminated or truncated:
                obs, _ = env.reset()
            synced = agent.steps_since_send < before + 1
            if synced and pause.exists():
                return
    except (ConnectionError, OSError, RLlinkError, ValueError) as exc:
        agent.soak_error = repr(exc)


# ---------------------------------------------------------------- driver
def start_workers(args, info: dict, state: Path, tmp: Path) -> list[tuple[subprocess.Popen, Path]]:
    workers = []
    n = max(1, args.workers)
    for w in range(n):
        tcp = args.tcp_clients // n + (w < args.tcp_clients % n)
        shm = args.shm_clients // n + (w < args.shm_clients % n)
        out = tmp / f"worker-{w}.json"
        cmd = [sys.executable, "-m", "bench.scenarios.soak", "--worker", str(out), "--tcp", str(tcp),
               "--shm", str(shm), "--seed", str(w), "--state-dir", str(state),
               "--tcp-address", f"tcp://127.0.0.1:{info['port']}"]
        workers.append((subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.DEVNULL), out))
    return workers


def collect_reports(workers, timeout_s: float = 300) -> list[dict]:
    for _, out in workers:
        Path(str(out) + ".pause").touch()
    deadline = time.monotonic() + timeout_s
    reports = []
    for proc, out in workers:
        while not out.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        reports.extend(json.loads(out.read_text()) if out.exists() else [])
    return reports


def compare(reports: list[dict], sessions: list[dict]) -> list[dict]:
    """Per client: steps it had acknowledged vs steps the daemon ingested for it."""
    by_key = {}
    for s in sessions:
        by_key[s["peer"]] = s
        by_key[str(s["id"])] = s
    rows = []
    for r in reports:
        s = by_key.get(r["key"])
        rows.append({"client": r["key"], "transport": r["transport"], "steps_sent": r["steps_sent"],
                     "steps_ingested": s["env_steps"] if s else None, "error": r["error"]})
    return rows


def rss_growth(samples: list[tuple[float, int]], duration_s: float) -> float:
    """Relative growth of the summed RSS from the end of warm-up to the end of the run."""
    warm = [rss for t, rss in samples if duration_s * 0.2 <= t <= duration_s * 0.3]
    tail = [rss for t, rss in samples if t >= duration_s * 0.9]
    if not warm or not tail:
        return 0.0
    return statistics.median(tail) / statistics.median(warm) - 1.0


def tree_rss_mb(daemon: Daemon) -> dict[str, float]:
    """RSS of the daemon's processes now, by role (children's cmdlines are anonymous)."""
    names = {pid: role for role, pid in daemon.role_pids().items()}
    try:
        root = psutil.Process(daemon.pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    out = {}
    for p in procs:
        try:
            out[names.get(p.pid, f"pid{p.pid}")] = round(p.memory_info().rss / 2**20, 1)
        except psutil.Error:
            continue
    return out


def error_lines(log: Path) -> list[str]:
    lines = log.read_text(errors="replace").splitlines()
    return [line for line in lines if '"level": "error"' in line or "Traceback" in line]


def drive(args: argparse.Namespace) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="rlinkd-soak-"))
    daemon = Daemon(args.set, state_dir=tmp / "state").start()
    workers = []
    try:
        sampler = TreeSampler(daemon.pid, interval_s=1.0).start()
        workers = start_workers(args, daemon.info, daemon.state_dir, tmp)
        time.sleep(args.duration_s * 0.25)
        rss_warm = tree_rss_mb(daemon)
        time.sleep(args.duration_s * 0.75)
        rss_end = tree_rss_mb(daemon)
        reports = collect_reports(workers)
        final = daemon.status(timeout_s=30)
        sampler.stop()
    finally:
        stop_processes([proc for proc, _ in workers])
        daemon.stop(120)
    rows = compare(reports, final["sessions"])
    return {"duration_s": args.duration_s, "tcp_clients": args.tcp_clients,
            "shm_clients": args.shm_clients, "clients": rows,
            "steps_sent": sum(r["steps_sent"] for r in rows),
            "steps_ingested": sum(r["steps_ingested"] or 0 for r in rows),
            "mismatched_clients": [r for r in rows if r["steps_sent"] != r["steps_ingested"]],
            "client_errors": [r for r in rows if r["error"]],
            "dropped_episodes": final.get("dropped_episodes"), "protocol_errors": final["protocol_errors"],
            "rss_growth": round(rss_growth(sampler.samples, args.duration_s), 4),
            "rss_mb_start_end": [round(sampler.samples[0][1] / 2**20), round(sampler.samples[-1][1] / 2**20)],
            "rss_mb_by_process_after_warmup": rss_warm, "rss_mb_by_process_at_end": rss_end,
            "rss_mb_series": [(round(t), round(r / 2**20)) for t, r in sampler.samples[::10]],
            "error_log_lines": error_lines(daemon.log_path)[:20],
            "daemon_exit": daemon.proc.returncode, "state_dir": str(daemon.state_dir)}


def passed(result: dict) -> bool:
    return (not result["mismatched_clients"] and not result["client_errors"]
            and SOAK_RSS_GROWTH.met(100 * result["rss_growth"]) and not result["error_log_lines"]
            and result["daemon_exit"] == 0 and result["steps_sent"] > 0)


def main(argv: list[str] | None = None) -> int:
    ap = client_load_parser(__doc__, "soak", tcp_clients=64, shm_clients=8)
    ap.add_argument("--duration-s", type=float, default=600.0)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--tcp", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--shm", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--state-dir", help=argparse.SUPPRESS)
    ap.add_argument("--tcp-address", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return run_worker(args)
    result = drive(args)
    result["passed"] = passed(result)
    write_result("soak", result, args.out)
    summary = {k: v for k, v in result.items() if k != "clients"}
    print(json.dumps(summary, indent=1))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
