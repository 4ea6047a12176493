"""RLlib 2.60's own client (the msgpack flavour) against rlinkd vs against RLlib 2.60's own server.

    .venv/bin/python -m bench.scenarios.rllib_msgpack [--runs 2] [--timeout-s 900]
                                                      [--ray-python PY] [--out FILE]

Both sides run RLlib's unmodified dummy CartPole client (``rllib_client.py`` from the anchors,
run by a ray 2.60 venv's python: ``--ray-python``, default ``$ANCHOR_ROOT/venv/bin/python`` as
``run_anchor.sh --ray 2.60.0`` makes it) until the client-side mean return of its last 100
complete episodes is >= 450. Time and env steps are the client's own (its ``reached`` line:
``t_s`` from the client's start, ``since_connect_s`` from its connection).

- ``rlinkd``: ``rlinkd serve`` with the default config (CartPole-v1 spaces, PPO, on-policy);
  the client starts once the daemon has published weights.
- ``rllib``: the anchors' ``rllib_server.py`` (RLlib's example PPO config,
  EnvRunnerServerForExternalInference); the client starts with the server, as
  ``run_anchor.sh --mode external`` does, and connects when RLlib listens (so ``t_s``
  includes RLlib's start-up; ``since_connect_s`` does not).

The two alternate, run by run. Peak summed RSS and CPU of server tree + client are sampled
from outside. Writes ``bench/results/rllib_msgpack.json``. Not in ``make bench`` (it needs a
ray venv).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from rlinkd.daemon.launch import stop_processes

from bench.harness.common import ANCHOR_ROOT, ANCHORS, free_port, median_range, write_result
from bench.harness.daemon import Daemon
from bench.harness.proctree import TreeSampler

TARGET = 450.0


def ray_env() -> dict:
    home = ANCHOR_ROOT / "home"
    home.mkdir(parents=True, exist_ok=True)
    return dict(os.environ, RAY_USAGE_STATS_ENABLED="0", HOME=str(home), PYTHONUNBUFFERED="1",
                RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")


def start_client(python: str, port: int, progress: Path, timeout_s: float) -> subprocess.Popen:
    cmd = [python, str(ANCHORS / "rllib_client.py"), "--host", "127.0.0.1", "--port", str(port),
           "--stop-return", str(TARGET), "--max-seconds", str(timeout_s), "--json-out", str(progress)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=ray_env())


def figures(progress: Path, sampler: TreeSampler, code: int | None) -> dict:
    """The client's last line (``reached`` when solved) and the sampled resources."""
    events = [json.loads(line) for line in progress.read_text().splitlines() if line.strip()]
    last = events[-1] if events else {}
    solved = last.get("event") == "reached"
    return {"solved": solved, "wall_s": last.get("t_s") if solved else None,
            "since_connect_s": last.get("since_connect_s"), "env_steps": last.get("env_steps"),
            "return_mean": last.get("return_mean_100"), "last_event": last.get("event"),
            "error": last.get("error"), "exit_code": code, "ray": (events[0] if events else {}).get("ray"),
            "peak_rss_mb": round(sampler.peak_rss_bytes / 2 ** 20, 1), "cpu_s": round(sampler.cpu_s, 1)}


def rlinkd_run(python: str, timeout_s: float) -> dict:
    with Daemon(port=free_port()) as daemon:
        daemon.wait_ready(120.0)
        progress = Path(daemon.state_dir) / "rllib_client.jsonl"
        client = start_client(python, daemon.port, progress, timeout_s)
        sampler = TreeSampler(daemon.pid, client.pid).start()
        try:
            code = client.wait(timeout_s + 120)
        finally:
            sampler.stop()
            stop_processes([client])
        status = daemon.status()
        return figures(progress, sampler, code) | {"daemon_env_steps": status.get("env_steps"),
                                                   "daemon_weights_seq_no": status.get("weights_seq_no")}


def rllib_run(python: str, timeout_s: float) -> dict:
    port = free_port()  # RLlib's EnvRunner listens on port + 1
    with tempfile.TemporaryDirectory(prefix="rllib-msgpack-") as tmp:
        progress = Path(tmp) / "rllib_client.jsonl"
        server = subprocess.Popen([python, str(ANCHORS / "rllib_server.py"), "--port", str(port),
                                   "--stop-reward", "1e9"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.STDOUT, env=ray_env(), start_new_session=True)
        client = start_client(python, port + 1, progress, timeout_s)
        sampler = TreeSampler(server.pid, client.pid).start()
        try:
            code = client.wait(timeout_s + 120)
        finally:
            sampler.stop()
            stop_processes([client])
            stop_group(server)
        return figures(progress, sampler, code)


def stop_group(proc: subprocess.Popen) -> None:
    """End RLlib's server and the ray processes it started (its own session: pgid == pid)."""
    for sig, wait_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if proc.poll() is not None:
            return


def summary(runs: list[dict]) -> dict:
    solved = [r for r in runs if r["solved"]]
    return {k: median_range([r[k] for r in solved if r.get(k) is not None], 1)
            for k in ("wall_s", "since_connect_s", "env_steps", "peak_rss_mb", "cpu_s")} | {
        "solved_runs": len(solved), "runs": len(runs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=2, help="runs per server (alternating)")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="per-run limit of the client")
    ap.add_argument("--ray-python", default=str(ANCHOR_ROOT / "venv" / "bin" / "python"),
                    help="python of a ray 2.60 venv (run_anchor.sh --ray 2.60.0 makes one)")
    ap.add_argument("--out", default=None, help="result file (default bench/results/rllib_msgpack.json)")
    args = ap.parse_args()
    res: dict = {"rlinkd": [], "rllib": []}
    for i in range(args.runs):
        for name, run in (("rlinkd", rlinkd_run), ("rllib", rllib_run)):
            r = run(args.ray_python, args.timeout_s)
            res[name].append(r)
            print(f"{name} run {i + 1}: {json.dumps(r)}", flush=True)
    payload = {"command": "python -m bench.scenarios.rllib_msgpack", "target_return": TARGET,
               "measured_at": time.strftime("%Y-%m-%d %H:%M"),
               **{name: {"runs": runs, "summary": summary(runs)} for name, runs in res.items()}}
    print(json.dumps({name: payload[name]["summary"] for name in res}), flush=True)
    write_result("rllib_msgpack", payload, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
