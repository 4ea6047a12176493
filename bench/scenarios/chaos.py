"""Chaos: SIGKILL random daemon children and random clients while training.

    python -m bench.scenarios.chaos [--kills 20] [--tcp-clients 3] [--shm-clients 2]

Each round SIGKILLs one random target — a role (collector, connector, learner,
checkpointer) or a client process (then a replacement client is started) — and
measures the recovery time: for a role, until it is alive again with a new pid, every
client is connected again *and*
training moved on (env steps and weights_seq_no both grew); for a client, until the
daemon counts the full number of clients again. Between rounds, a checkpoint is
requested (SIGUSR1). At the end: every checkpoint on disk verifies, the newest one
loads with ``torch.load(weights_only=True)``, the daemon stops with exit 0, and no
shared-memory segment of this daemon is left. Writes bench/results/chaos.json.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlinkd.client_lib.transport import RLlinkError
from rlinkd.daemon.launch import rlinkd_command, stop_processes
from rlinkd.daemon.roster import ROLES
from rlinkd.daemon.runfiles import query_status

from bench.harness.common import client_load_parser, write_result
from bench.harness.daemon import Daemon



def try_status(info: dict) -> dict | None:
    """Status, or None while the collector (which serves it) is restarting."""
    try:
        status = query_status(info, timeout_s=5)
    except (OSError, RLlinkError, ValueError):
        return None
    return status if "children" in status else None


def wait_until(predicate, timeout_s: float) -> float | None:
    """Seconds until ``predicate()`` holds (polled every 50 ms), None at the timeout."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if predicate():
            return time.monotonic() - t0
        time.sleep(0.05)
    return None


def start_client(address: str, log_path: Path) -> subprocess.Popen:
    """One client appending to ``log_path``; the parent's handle is closed once the child has it."""
    cmd = rlinkd_command("client", "--connect", address, "--report-every-s", "3600")
    with open(log_path, "ab") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


class Chaos:
    """The daemon, its clients, and the bookkeeping of kills and recoveries."""

    def __init__(self, args: argparse.Namespace, state: Path) -> None:
        self.args, self.state = args, state
        self.rng = random.Random(args.seed)
        self.daemon = Daemon(["daemon.crash_loop_restarts=1000", "daemon.restart_backoff_s=0.2",
                              "checkpoint.checkpoint_interval_s=0"], state_dir=state).start()
        self.info = self.daemon.info
        self.client_log = state / "clients.log"
        self.addresses = ([f"tcp://127.0.0.1:{self.info['port']}"] * args.tcp_clients
                          + [f"shm:{state}"] * args.shm_clients)
        self.clients = [start_client(a, self.client_log) for a in self.addresses]
        self.kills: list[dict] = []

    def n_clients(self) -> int:
        return len(self.addresses)

    def healthy(self) -> bool:
        s = try_status(self.info)
        return bool(s) and s["clients"] == self.n_clients() and all(
            c["alive"] for c in s["children"].values())

    def kill_role(self, role: str) -> dict:
        before = try_status(self.info)
        pid = before["children"][role]["pid"]
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()

        def recovered() -> bool:
            s = try_status(self.info)
            return bool(s) and s["children"][role]["alive"] and s["children"][role]["pid"] != pid \
                and s["env_steps"] > before["env_steps"] and s["weights_seq_no"] > before["weights_seq_no"] \
                and s["clients"] == self.n_clients()
        took = wait_until(recovered, self.args.recovery_timeout_s)
        return {"target": role, "recovered": took is not None,
                "recovery_s": None if took is None else round(time.monotonic() - t0, 3)}

    def kill_client(self) -> dict:
        i = self.rng.randrange(len(self.clients))
        self.clients[i].kill()
        self.clients[i].wait()
        t0 = time.monotonic()
        wait_until(lambda: (s := try_status(self.info)) and s["clients"] < self.n_clients(), 10)
        self.clients[i] = start_client(self.addresses[i], self.client_log)
        took = wait_until(self.healthy, self.args.recovery_timeout_s)
        kind = "shm" if self.addresses[i].startswith("shm") else "tcp"
        return {"target": f"client-{kind}", "recovered": took is not None,
                "recovery_s": None if took is None else round(time.monotonic() - t0, 3)}

    def round(self) -> dict:
        result = self.kill_client() if self.rng.random() < 1 / 3 else self.kill_role(self.rng.choice(ROLES))
        os.kill(self.daemon.pid, signal.SIGUSR1)
        wait_until(self.healthy, self.args.recovery_timeout_s)
        time.sleep(self.rng.uniform(0.5, 2.0))
        return result

    def finish(self) -> dict:
        stop_processes(self.clients, 60)
        code = self.daemon.stop(120)
        leaks = [n for n in os.listdir(self.info["shm_dir"]) if n.startswith(f"rlinkd.{self.daemon.pid}.")]
        return {"daemon_exit": code, "shm_leaks": leaks, **verify_checkpoints(self.state)}


def verify_checkpoints(state: Path) -> dict:
    import torch
    from rlinkd.daemon.checkpoint import store
    root = store.checkpoints_dir(state)
    paths = store.list_checkpoints(root)
    bad = []
    for path in paths:
        try:
            store.verify(path)
        except Exception as exc:  # noqa: BLE001 - reported as a failed check
            bad.append(f"{path.name}: {exc}")
    newest = store.latest_valid(root)
    loadable = False
    if newest is not None:
        state_dict = torch.load(io.BytesIO(store.read_checkpoint_file(newest.path, "learner.pt")),
                                weights_only=True)
        loadable = "learner" in state_dict
    return {"checkpoints": len(paths), "corrupt_checkpoints": bad, "newest_loads": loadable}


def summarize(kills: list[dict], final: dict) -> dict:
    times = [k["recovery_s"] for k in kills if k["recovered"]]
    return {"kills": len(kills), "survived": sum(k["recovered"] for k in kills),
            "by_target": {t: sum(k["target"] == t for k in kills) for t in sorted({k["target"] for k in kills})},
            "recovery_p50_s": round(statistics.median(times), 3) if times else None,
            "recovery_max_s": max(times) if times else None, **final,
            "passed": all(k["recovered"] for k in kills) and final["daemon_exit"] == 0
            and not final["shm_leaks"] and not final["corrupt_checkpoints"] and final["newest_loads"]}


def main(argv: list[str] | None = None) -> int:
    ap = client_load_parser(__doc__, "chaos", tcp_clients=3, shm_clients=2)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--recovery-timeout-s", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    state = Path(tempfile.mkdtemp(prefix="rlinkd-chaos-")) / "state"
    state.mkdir()
    chaos = Chaos(args, state)
    wait_until(chaos.healthy, 120)
    try:
        kills = [chaos.round() for _ in range(args.kills)]
    finally:
        final = chaos.finish()
    result = {"summary": summarize(kills, final), "kills": kills, "state_dir": str(state)}
    write_result("chaos", result, args.out)
    print(json.dumps(result["summary"], indent=1))
    return 0 if result["summary"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
