"""rlinkd time-to-solve CartPole-v1 under the same two definitions as the RLlib baseline.

    .venv/bin/python -m bench.scenarios.rlinkd_solve [--runs 3] [--timeout-s 600] [--quick]
                                           [--skip-rllib-client | --reuse-rllib-client]
                                           [--rllib-client-seconds S] [--out FILE]

Configurations: TCP and shared-memory clients, 1 and 2 of them, default daemon config.

(i) ``own`` - the daemon's own criterion: ``rlinkd demo --clients N --transport T`` until the
    daemon's mean return of the last 20 episodes is >= 450 (what ``make demo`` does). Wall
    time from launching the demo (daemon start-up included) to the progress line showing
    450 (shutdown excluded), env steps from the daemon's status.
(ii) ``client`` - the client-side criterion of RLlib's external mode: ``rlinkd serve`` and N
    ``bench.scenarios.solve_client`` processes are launched at the same moment (as run_anchor.sh
    launches RLlib's server and client); the clients' complete episodes are pooled in time
    order and the run is solved when the mean of the last 100 is >= 450 (with at least 10
    episodes, exactly the rule of rllib_client.py). Wall time from the clients' launch, env
    steps counted by the clients (each client reports its count at the end of each of its
    episodes, so with 2 clients the other one's episode in progress is not counted).
(iii) ``rllib_client`` - RLlib 2.48's own dummy client (``rllib_client.py`` from the anchors,
    run by the 2.48 venv's python, JSON + ONNX flavour) against ``rlinkd serve`` (default,
    on-policy config), started once the daemon is ready; time and steps from its own
    ``reached`` line (its clock starts before it imports ray). ``--quick`` caps it at 60 s
    (a check that it connects and trains, not necessarily to 450).

Every run records its learning curve (``curve``, see ``bench.harness.curves``): (i) the
daemon's last-20 mean from the demo's once-a-second progress lines, (ii) the pooled
client-side last-100 mean after every episode; ``bench.report.plots`` draws them.
``--reuse-rllib-client`` keeps (iii) from the existing result file instead of running it.

For every run: env steps/s = env steps / wall; peak summed RSS of every process involved
(daemon tree + clients), sampled every 0.2 s from outside; CPU seconds of all of them
(user+system) per 100k env steps. Summaries are medians (min-max). Writes
``bench/results/solve_compare.json``.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

from rlinkd.daemon.launch import LaunchError, stop_processes

from bench.harness.common import (ANCHOR_ROOT, ANCHORS, REPO, RESULTS, fmt_mr, free_port, median_range,
                                  print_table, write_result)
from bench.harness.curves import demo_points, make_curve
from bench.harness.daemon import Daemon
from bench.harness.demo import demo_command, demo_summary
from bench.harness.proctree import TreeSampler

TARGET = 450.0
LEGACY_PYTHON = ANCHOR_ROOT / "venv" / "legacy-2.48.0" / "bin" / "python"
CONFIGS = [("tcp", 1), ("tcp", 2), ("shm", 1), ("shm", 2)]


def measures(wall_s: float | None, env_steps: int | None, sampler: TreeSampler, solved: bool,
             cpu_steps: int | None = None) -> dict:
    """The common figures of one run (RLlib's baseline reports the same keys)."""
    cpu_steps = cpu_steps or env_steps
    return {"solved": solved, "wall_s": None if wall_s is None else round(wall_s, 2),
            "env_steps": env_steps,
            "steps_per_s": round(env_steps / wall_s, 1) if wall_s and env_steps else None,
            "peak_rss_mb": round(sampler.peak_rss_bytes / 2 ** 20, 1), "cpu_s": round(sampler.cpu_s, 1),
            "cpu_s_per_100k_steps": round(sampler.cpu_s / cpu_steps * 1e5, 2) if cpu_steps else None}


# ---------------------------------------------------------------- (i) own criterion
def own_run(transport: str, clients: int, timeout_s: float) -> dict:
    """``rlinkd demo``: SOLVED when the daemon's last-20 mean return reaches 450.

    Wall time = arrival (read live from its stdout) of the progress line that showed the
    mean at 450, minus the launch: the demo's shutdown afterwards is not counted.
    """
    state = tempfile.mkdtemp(prefix="rlinkd-bench-")
    cmd = demo_command(clients, transport, timeout_s=timeout_s, state_dir=state)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    sampler = TreeSampler(proc.pid).start()
    lines = [(time.monotonic() - t0, line) for line in proc.stdout]  # ends when the demo exits
    proc.wait(60)
    sampler.stop()
    progress = [(t, line) for t, line in lines if line.startswith("[")]
    summary = demo_summary("".join(line for _, line in lines))
    solved = bool(summary.get("solved")) and proc.returncode == 0
    if solved:
        shutil.rmtree(state, ignore_errors=True)  # kept for a look when it failed
    wall = progress[-1][0] if solved and progress else None
    return measures(wall, summary.get("env_steps"), sampler, solved) | {
        "demo_wall_s": summary.get("wall_s"), "return_mean": summary.get("return_mean_20"),
        "curve": make_curve(demo_points(progress)), **({} if solved else {"state_dir": state})}


# ---------------------------------------------------------------- (ii) client-side criterion
class EpisodePool:
    """Complete episodes of every client; solved when the last-100 mean reaches the target.
    ``points``: the learning curve, one point per episode (seconds since ``t0``, the clients'
    launch on the same monotonic clock; pooled steps; last-100 mean)."""

    def __init__(self, n_clients: int, t0: float = 0.0) -> None:
        self.t0 = t0
        self.points: list[tuple[float, float, float]] = []
        self.lock = threading.Lock()
        self.returns: deque = deque(maxlen=100)
        self.steps_by_client = [0] * n_clients
        self.solved_at: float | None = None
        self.steps_at_solve: int | None = None
        self.solved = threading.Event()

    def add(self, client: int, t: float, ret: float, steps: int) -> None:
        with self.lock:
            self.steps_by_client[client] = steps
            self.returns.append(ret)
            self.points.append((t - self.t0, sum(self.steps_by_client), sum(self.returns) / len(self.returns)))
            if (self.solved_at is None and len(self.returns) >= 10
                    and sum(self.returns) / len(self.returns) >= TARGET):
                self.solved_at, self.steps_at_solve = t, sum(self.steps_by_client)
                self.solved.set()

    def follow(self, client: int, stream) -> None:
        """Thread body: read one client's JSON lines."""
        for line in stream:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a log line of the client library
            if "ret" in rec:
                self.add(client, rec["t"], rec["ret"], rec["steps"])


def client_run(transport: str, n_clients: int, timeout_s: float) -> dict:
    """Daemon + clients launched together; solved on the pooled client-side criterion."""
    port = free_port()
    daemon = Daemon(port=port).launch()
    state_dir = daemon.state_dir
    address = f"tcp://127.0.0.1:{port}" if transport == "tcp" else f"shm:{state_dir}"
    t0 = time.monotonic()
    clients = [_start_solve_client(address, i, Path(state_dir)) for i in range(n_clients)]
    sampler = TreeSampler(daemon.pid, *[c.pid for c in clients]).start()
    pool = EpisodePool(n_clients, t0)
    for i, c in enumerate(clients):
        threading.Thread(target=pool.follow, args=(i, c.stdout), daemon=True).start()
    try:
        ready_s = _time_to_ready(daemon, t0)
        pool.solved.wait(max(0.0, timeout_s - (time.monotonic() - t0)))
    finally:
        sampler.stop()
        stop_processes(clients)
        exit_code = daemon.stop()
    solved = pool.solved_at is not None
    wall = pool.solved_at - t0 if solved else None
    mean = round(sum(pool.returns) / len(pool.returns), 1) if pool.returns else None
    return measures(wall, pool.steps_at_solve if solved else sum(pool.steps_by_client), sampler, solved,
                    cpu_steps=sum(pool.steps_by_client)) | {
        "daemon_ready_s": ready_s, "daemon_exit": exit_code, "return_mean": mean,
        "curve": make_curve(pool.points)}


def _start_solve_client(address: str, i: int, state_dir: Path) -> subprocess.Popen:
    """Client ``i`` (seed 1000 + i), episodes on a pipe, its log in ``state_dir/client{i}.log``."""
    with open(state_dir / f"client{i}.log", "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "bench.scenarios.solve_client", "--connect", address,
                                 "--seed", str(1000 + i)], stdout=subprocess.PIPE, stderr=log, text=True,
                                cwd=REPO)


def _time_to_ready(daemon: Daemon, t0: float) -> float | None:
    """Seconds from launch until the daemon answers with weights (information only)."""
    try:
        daemon.wait_ready(120.0)
    except LaunchError:
        return None
    return round(time.monotonic() - t0, 2)


# ---------------------------------------------------------------- (iii) RLlib's client
def rllib_client_run(timeout_s: float) -> dict:
    """RLlib 2.48's dummy client (its own code, JSON flavour) against ``rlinkd serve``."""
    with Daemon(port=free_port()) as daemon:
        progress = Path(daemon.state_dir) / "rllib_client.jsonl"
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", HOME=str(ANCHOR_ROOT / "home"),
                   PYTHONUNBUFFERED="1")
        cmd = [str(LEGACY_PYTHON), str(ANCHORS / "rllib_client.py"), "--host", "127.0.0.1",
               "--port", str(daemon.port), "--stop-return", str(TARGET),
               "--max-seconds", str(timeout_s), "--json-out", str(progress)]
        client = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env)
        sampler = TreeSampler(daemon.pid, client.pid).start()
        try:
            code = client.wait(timeout_s + 120)
        finally:
            sampler.stop()
            stop_processes([client])
        events = [json.loads(line) for line in progress.read_text().splitlines() if line.strip()]
        status = daemon.status()
    last = events[-1] if events else {}
    solved = last.get("event") == "reached"
    return measures(last.get("t_s") if solved else None, last.get("env_steps"), sampler, solved) | {
        "exit_code": code, "last_event": last.get("event"), "since_connect_s": last.get("since_connect_s"),
        "return_mean": last.get("return_mean_100"), "client": (events[0] if events else {}).get("client"),
        "ray": (events[0] if events else {}).get("ray"), "daemon_weights_seq_no": status.get("weights_seq_no"),
        "daemon_env_steps": status.get("env_steps"), "error": last.get("error")}


# ---------------------------------------------------------------- driver and report
def summarize(runs: list[dict]) -> dict:
    """Medians (min-max) over solved runs; counts of solved runs."""
    solved = [r for r in runs if r.get("solved")]
    keys = ("wall_s", "env_steps", "steps_per_s", "peak_rss_mb", "cpu_s_per_100k_steps")
    return {k: median_range([r[k] for r in solved], 2) for k in keys} | {
        "solved_runs": len(solved), "runs": len(runs), "unsolved": unsolved_notes(runs)}


def unsolved_notes(runs: list[dict]) -> list[str]:
    """'mean 244 after 48,000 steps' for every run that did not reach the target."""
    return [f"mean {r.get('return_mean')} after {r.get('env_steps') or 0:,} steps"
            for r in runs if not r.get("solved")]


def run_mode(label: str, fn, runs: int) -> dict:
    results = []
    for i in range(runs):
        results.append(fn())
        r = results[-1]
        print(f"  {label} run {i + 1}: solved={r.get('solved')} wall={r.get('wall_s')} s "
              f"steps={r.get('env_steps')} rss={r.get('peak_rss_mb')} MiB", flush=True)
    return {"runs": results, "summary": summarize(results)}


def table(res: dict) -> str:
    rows = []
    for crit, name in (("own", "daemon last-20 ≥ 450 (`rlinkd demo`)"),
                       ("client", "client-side last-100 ≥ 450, from client start")):
        for key, s in res[crit].items():
            rows.append(_row(f"{name}, {key.replace('x', ' × ')}", s["summary"]))
    if "summary" in res.get("rllib_client", {}):
        rows.append(_row("RLlib 2.48 dummy client → rlinkd serve (client-side)", res["rllib_client"]["summary"]))
    return print_table("rlinkd time to solve CartPole-v1 (median (min – max))",
                       ("definition, clients", "solved", "wall s", "env steps", "steps/s",
                        "peak RSS MiB", "CPU s / 100k steps"), rows)


def _row(label: str, s: dict) -> tuple:
    note = f" (unsolved: {'; '.join(s['unsolved'])})" if s.get("unsolved") else ""
    return (label, f"{s['solved_runs']}/{s['runs']}{note}", fmt_mr(s["wall_s"], 1), fmt_mr(s["env_steps"]),
            fmt_mr(s["steps_per_s"]), fmt_mr(s["peak_rss_mb"]), fmt_mr(s["cpu_s_per_100k_steps"], 1))


def earlier_rllib_client() -> dict:
    """(iii) as the published result file has it, with ``reused_from`` naming its measurement."""
    try:
        earlier = json.loads((RESULTS / "solve_compare.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    section = earlier.get("rllib_client") or {}
    return section and {**section, "reused_from": f"{earlier.get('command')} at {earlier.get('measured_at')}"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--timeout-s", type=float, default=600.0, help="per run")
    ap.add_argument("--quick", action="store_true",
                    help="1 run of tcp×1 and shm×1 per definition; RLlib's client for at most 60 s")
    ap.add_argument("--skip-rllib-client", action="store_true")
    ap.add_argument("--out", help="result file (default: bench/results/solve_compare.json)")
    ap.add_argument("--reuse-rllib-client", action="store_true",
                    help="do not run (iii): keep the rllib_client section of the existing result file, "
                         "marked with the time it was measured")
    ap.add_argument("--rllib-client-seconds", type=float, default=None,
                    help="limit of each RLlib-client run (default: --timeout-s; --quick: 60)")
    args = ap.parse_args()
    runs = 1 if args.quick else args.runs
    rllib_limit = args.rllib_client_seconds or (60.0 if args.quick else args.timeout_s)
    configs = [("tcp", 1), ("shm", 1)] if args.quick else CONFIGS
    res: dict = {"quick": args.quick, "target": TARGET, "own": {}, "client": {}}
    for transport, n in configs:
        key = f"{transport}x{n}"
        print(f"(i) own criterion, {key}", flush=True)
        res["own"][key] = run_mode(key, functools.partial(own_run, transport, n, args.timeout_s), runs)
        print(f"(ii) client-side criterion, {key}", flush=True)
        res["client"][key] = run_mode(key, functools.partial(client_run, transport, n, args.timeout_s), runs)
    if args.reuse_rllib_client:
        res["rllib_client"] = earlier_rllib_client()
        print(f"(iii) reused from {res['rllib_client'].get('reused_from', 'nowhere (none recorded)')}", flush=True)
    elif args.skip_rllib_client:
        pass
    elif not LEGACY_PYTHON.exists():
        res["rllib_client"] = {"skipped": f"{LEGACY_PYTHON} not found: create it with "
                                          f"{ANCHORS}/run_anchor.sh --ray 2.48.0 --runs 0"}
        print(f"(iii) skipped: {res['rllib_client']['skipped']}", flush=True)
    else:
        print("(iii) RLlib 2.48 dummy client against rlinkd serve", flush=True)
        res["rllib_client"] = run_mode("rllib-2.48-client", lambda: rllib_client_run(rllib_limit), runs)
    res["table_markdown"] = table(res)
    write_result("solve_compare", res, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
