"""The real collector alone: ``CollectorProcess`` (CollectorServer + CollectorCore, the
asyncio shell the daemon runs) in one process, with a consumer process that drains the
episode ring as fast as it can instead of the connector and learner.

It takes the learner out of a measurement: TCP clients talk to exactly the code they meet
in ``rlinkd serve`` (listener, framing, orjson decoding, vectorised validation, record
conversion, ingest ids, ring writes, SET_STATE frames from the weights board), but a full
episode ring never pushes back because nothing trains. The weights board holds one
version (zeros, published here as the learner would at boot), so SET_STATE replies work.

    python -m bench.harness.collector --state-dir D [--set section.key=value ...]

prints one JSON line ``{"port": P, "unix_socket": S, "pid": PID}`` once listening and runs
until SIGTERM. ``IsolatedCollector`` starts and stops it from a benchmark.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from rlinkd.daemon.launch import set_args, stop_processes

from bench.harness.common import REPO


def drain_ring(ring_path: str, layout_json: dict, space_doorbell, stop) -> None:
    """Consumer process: read and discard every record until ``stop`` is set; rings the
    collector's space doorbell (``space_doorbell``: the topology's SharedFd) as the
    connector does."""
    from rlinkd.shm.doorbell import Doorbell
    from rlinkd.shm.records import StepLayout
    from rlinkd.shm.ring import StepRing
    ring = StepRing.attach(ring_path, expected_layout=StepLayout.from_json(layout_json), role="consumer",
                           space_doorbell=Doorbell.from_fd(space_doorbell.fd))
    try:
        while not stop.is_set():
            if not len(ring.read_batch(1 << 15)):
                time.sleep(0.0002)
    finally:
        ring.close()


def _watch_supervisor_inbox(topo, ready: threading.Event) -> None:
    """Print the listening port once; keep draining status reports (nobody else reads them)."""
    from rlinkd.daemon import messages as m
    inbox = topo.inboxes["supervisor"]
    while True:
        msg = inbox.recv(0.5)
        if isinstance(msg, m.Listening) and not ready.is_set():
            print(json.dumps({"port": msg.port, "unix_socket": msg.unix_socket}), flush=True)
            ready.set()


def _publish_initial_weights(topo) -> None:
    """What the learner does at boot: version 0 on the board (zeros are valid weights)."""
    import numpy as np
    from rlinkd.shm.board import WeightsBoard
    board = WeightsBoard.attach(topo.default.board_path)
    board.publish(0, np.zeros(topo.default.spec.n_params(), np.float32))
    board.close()


def _quiet_logs() -> None:
    """Warnings and errors only, on stderr: stdout carries the one JSON line."""
    import logging
    import structlog
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
                        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def serve(state_dir: str, overrides: list[str]) -> int:
    """Run the collector with a draining consumer until SIGTERM."""
    from rlinkd.daemon.collector.process import CollectorProcess
    from rlinkd.daemon.config import load_config, parse_override
    from rlinkd.daemon.roles import RoleContext
    from rlinkd.daemon.wiring import build_topology, destroy_topology
    _quiet_logs()
    cfg = load_config(None, [parse_override(o) for o in overrides]
                      + [("daemon", "state_dir", state_dir), ("server", "port", 0)])
    cfg.runtime_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    topo = build_topology(cfg)
    stop = mp.get_context("spawn").Event()
    consumer = mp.get_context("spawn").Process(
        target=drain_ring, daemon=True,
        args=(topo.default.episode_ring_path, topo.default.layout_json, topo.episode_space_doorbell, stop))
    consumer.start()
    try:
        _publish_initial_weights(topo)
        ctx = RoleContext("collector", topo, in_process=True)
        signal.signal(signal.SIGTERM, lambda *_: ctx.stop.set())
        ready = threading.Event()
        threading.Thread(target=_watch_supervisor_inbox, args=(topo, ready), daemon=True).start()
        proc = CollectorProcess(topo, ctx)
        asyncio.run(proc.main())
        proc.ring.close()
        proc.board.close()
    finally:
        stop.set()
        consumer.join(5)
        if consumer.is_alive():
            consumer.kill()
        destroy_topology(topo)
    return 0


class IsolatedCollector:
    """Start ``python -m bench.harness.collector`` and read its port; stop it by pid."""

    def __init__(self, overrides: list[str] | None = None) -> None:
        self.overrides = overrides or []
        self.state_dir = tempfile.mkdtemp(prefix="rlinkd-bench-coll-")
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.unix_socket = ""

    def __enter__(self) -> IsolatedCollector:
        cmd = [sys.executable, "-m", "bench.harness.collector", "--state-dir", self.state_dir,
               *set_args(self.overrides)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(
            Path(self.state_dir) / "harness.log", "ab"), cwd=REPO, text=True)
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(10)
            raise RuntimeError(f"collector harness exited with {self.proc.returncode}: "
                               f"{(Path(self.state_dir) / 'harness.log').read_text()[-2000:]}")
        info = json.loads(line)
        self.port, self.unix_socket = int(info["port"]), info["unix_socket"]
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            stop_processes([self.proc])
        shutil.rmtree(self.state_dir, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--set", action="append", default=[])
    args = ap.parse_args()
    return serve(args.state_dir, args.set)


if __name__ == "__main__":
    sys.exit(main())
