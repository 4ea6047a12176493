"""Shared helpers of the benchmark scripts.

- statistics (``median_range``, ``percentiles``) and result files (``write_result``);
- ``Daemon``: ``rlinkd serve`` started as a real process with its own state directory,
  queried over its Unix socket, stopped by pid;
- raw RLlink frames built with orjson from CartPole-sized episodes (4 observation
  floats, Discrete(2) actions, 2 logits, log-probs), the same data every transport
  benchmark sends.

Only loopback addresses are used. Every process a script starts is stopped by its pid.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import psutil

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
LOOPBACK = "127.0.0.1"
EPISODE_STEPS = 255
"""Steps per benchmark episode (terminated): 256 step records with its FINAL_OBS record."""
STEPS_PER_MESSAGE = 2 * EPISODE_STEPS
"""Env steps per RLlink message (510, about the default ``sampling.env_steps_per_sample``)."""


# ---------------------------------------------------------------- statistics and results
def median_range(values: list[float], ndigits: int = 3) -> dict:
    """{"median", "min", "max", "n"} of the values (None entries are ignored)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": round(statistics.median(vals), ndigits), "min": round(min(vals), ndigits),
            "max": round(max(vals), ndigits), "n": len(vals)}


def percentiles(values: list[float], qs: tuple[int, ...] = (50, 90, 99), ndigits: int = 1) -> dict:
    """{"p50": .., "p99": .., "n": ..}: linear-interpolated percentiles (numpy default)."""
    if not values:
        return {f"p{q}": None for q in qs} | {"n": 0}
    arr = np.asarray(values, np.float64)
    return {f"p{q}": round(float(np.percentile(arr, q)), ndigits) for q in qs} | {
        "n": len(values), "max": round(float(arr.max()), ndigits)}


def write_result(name: str, payload: dict, module: str | None = None) -> Path:
    """Write ``bench/results/<name>.json`` with the command, CPU count and time added."""
    RESULTS.mkdir(exist_ok=True)
    command = " ".join([".venv/bin/python -m", module or f"bench.{name}", *sys.argv[1:]])
    doc = {"command": command, "cpu_count": os.cpu_count(),
           "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
           "load_avg_1m_at_end": round(os.getloadavg()[0], 2), **payload}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1, default=_json_default))
    return path


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (small race, loopback only)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def rlinkd_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "rlinkd.daemon.cli", *args]


def set_args(overrides: list[str]) -> list[str]:
    return [arg for o in overrides for arg in ("--set", o)]


# ---------------------------------------------------------------- raw RLlink
def frame(obj: dict) -> bytes:
    """One RLlink frame: 8-digit zero-padded length, then the orjson body."""
    body = orjson.dumps(obj)
    return b"%08d" % len(body) + body


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("peer closed the connection")
        got += k
    return bytes(buf)


def recv_frame(sock: socket.socket) -> dict:
    size = int(recv_exactly(sock, 8))
    return orjson.loads(recv_exactly(sock, size))


def request(sock: socket.socket, obj: dict) -> dict:
    sock.sendall(frame(obj))
    return recv_frame(sock)


def cartpole_obs(n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` CartPole observations well inside the declared Box (float32, shape [n, 4])."""
    return rng.uniform(-0.2, 0.2, size=(n, 4)).astype(np.float32)


def cartpole_episode(steps: int, rng: np.random.Generator, terminated: bool = True) -> dict:
    """One RLlink episode as client_lib sends it: obs, actions, rewards, logp, dist inputs."""
    obs = cartpole_obs(steps + 1, rng)
    logits = rng.normal(0, 0.1, size=(steps, 2)).astype(np.float32)
    return {"obs": obs.tolist(), "actions": rng.integers(0, 2, steps).tolist(),
            "rewards": [1.0] * steps, "is_terminated": terminated, "is_truncated": False,
            "action_logp": np.full(steps, -0.69, np.float32).tolist(),
            "action_dist_inputs": logits.tolist()}


def episodes_frame(msg_type: str = "EPISODES", steps: int = STEPS_PER_MESSAGE,
                   episode_steps: int = EPISODE_STEPS, seed: int = 0) -> bytes:
    """A pre-encoded EPISODES (or EPISODES_AND_GET_STATE) frame of ``steps`` env steps."""
    rng = np.random.default_rng(seed)
    episodes, left = [], steps
    while left > 0:
        n = min(episode_steps, left)
        episodes.append(cartpole_episode(n, rng))
        left -= n
    return frame({"type": msg_type, "episodes": episodes, "env_steps": steps})


def handshake(sock: socket.socket) -> dict:
    """PING and GET_CONFIG; returns SET_CONFIG."""
    assert request(sock, {"type": "PING"})["type"] == "PONG"
    return request(sock, {"type": "GET_CONFIG"})


def status_over_unix(path: str, timeout_s: float = 10.0) -> dict:
    """The daemon's status dict (STATUS over its Unix socket)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(path)
        reply = request(sock, {"type": "STATUS"})
    if reply.get("type") != "STATUS_REPORT":
        raise RuntimeError(f"STATUS got {reply.get('type')}: {reply.get('message')}")
    return reply["status"]


# ---------------------------------------------------------------- a daemon process
@dataclass
class Daemon:
    """``rlinkd serve`` as a subprocess (own state dir, log in ``<state_dir>/rlinkd.log``)."""

    overrides: list[str] = field(default_factory=list)
    port: int = 0
    env: dict | None = None
    state_dir: Path | None = None
    proc: subprocess.Popen | None = None
    info: dict = field(default_factory=dict)
    started_at: float = 0.0
    _own_state_dir: bool = False

    def launch(self) -> "Daemon":
        """Start the process without waiting (``wait_ready`` waits)."""
        if self.state_dir is None:
            self.state_dir = Path(tempfile.mkdtemp(prefix="rlinkd-bench-"))
            self._own_state_dir = True
        self.state_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.state_dir / "rlinkd.log", "ab")
        cmd = rlinkd_cmd("serve", "--state-dir", str(self.state_dir), "--port", str(self.port),
                         "--fresh", *set_args(self.overrides))
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=REPO, env=dict(os.environ, **(self.env or {})))
        log.close()
        return self

    def start(self, timeout_s: float = 120.0) -> "Daemon":
        return self.launch().wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float = 120.0) -> "Daemon":
        """Until daemon.json names our pid and the first weights exist (status answers)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log_tail()}")
            info = self._daemon_file()
            if info and self._weights_ready(info):
                self.info = info
                return self
            time.sleep(0.05)
        raise RuntimeError(f"daemon not ready after {timeout_s:g} s:\n{self.log_tail()}")

    def _daemon_file(self) -> dict | None:
        path = self.state_dir / "daemon.json"
        try:
            info = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return info if info.get("pid") == self.proc.pid else None

    @staticmethod
    def _weights_ready(info: dict) -> bool:
        try:
            return status_over_unix(info["unix_socket"], 5.0).get("weights_seq_no", -1) >= 0
        except (OSError, RuntimeError):
            return False

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def tcp_port(self) -> int:
        return int(self.info["port"])

    @property
    def unix_socket(self) -> str:
        return self.info["unix_socket"]

    def status(self) -> dict:
        return status_over_unix(self.unix_socket)

    def role_pids(self) -> dict[str, int]:
        """{"supervisor": pid, "collector": pid, ...} from status ``children``."""
        children = self.status().get("children") or {}
        return {"supervisor": self.pid} | {role: int(c["pid"]) for role, c in children.items()
                                           if c.get("pid")}

    def log_tail(self, n_chars: int = 4000) -> str:
        path = self.state_dir / "rlinkd.log" if self.state_dir else None
        return path.read_text(errors="replace")[-n_chars:] if path and path.exists() else ""

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM our daemon (by pid), wait; SIGKILL it and its leftover children on timeout."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            kids = _children(self.proc.pid)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                kill_pids(kids)
        if self._own_state_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        return self.proc.returncode

    def __enter__(self) -> "Daemon":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _children(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def kill_pids(pids: list[int]) -> None:
    """SIGKILL each pid we started (already gone is fine)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def stop_procs(procs: list[subprocess.Popen], timeout_s: float = 20.0) -> None:
    """SIGTERM each process we started, then SIGKILL what is still running at the deadline."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def print_table(title: str, header: tuple[str, ...], rows: list[tuple]) -> str:
    """Print (and return) a markdown table."""
    lines = [f"**{title}**", "", "| " + " | ".join(header) + " |",
             "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def fmt_num(value, digits: int = 0) -> str:
    """1234567.8 -> '1,234,568'; None -> '–'."""
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def fmt_mr(d: dict | None, digits: int = 0, scale: float = 1.0) -> str:
    """'median (min – max)' of a median_range dict."""
    if not d or d.get("median") is None:
        return "–"
    f = lambda v: fmt_num(v * scale, digits)  # noqa: E731
    if d.get("n", 1) <= 1:
        return f(d["median"])
    return f"{f(d['median'])} ({f(d['min'])} – {f(d['max'])})"
