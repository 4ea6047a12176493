"""The C client (client_lib/c) against a real daemon: its CartPole, written in C, learns
through server-side actions over TCP and over shared-memory lanes; a daemon restart mid-run
is survived on both (the client reconnects and its episodes go on). The library and the example are built here with the
client's own Makefile (AddressSanitizer + UndefinedBehaviorSanitizer for the restart test,
so real traffic runs under the sanitizers too)."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading

import pytest

from tests.helpers import REPO, wait_for

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

C_DIR = REPO / "client_lib" / "c"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """build/c with the optimised and the sanitized example (a compiler error fails here)."""
    out = tmp_path_factory.mktemp("c-build")
    subprocess.run(["make", "-s", "-C", str(C_DIR), f"OUT={out}", "all", f"{out}/san/cartpole"],
                   check=True, capture_output=True, timeout=180)
    return out


def run_cartpole(binary, address: str, *args: str, timeout_s: float = 240.0) -> dict:
    """The example until it exits; its final JSON line (the progress lines before it)."""
    proc = subprocess.run([str(binary), address, *args], capture_output=True, text=True,
                          timeout=timeout_s)
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr
    return json.loads(lines[-1]) | {"exit": proc.returncode, "stderr": proc.stderr}


def address(d, transport: str) -> str:
    return f"tcp://127.0.0.1:{d.port}" if transport == "tcp" else f"shm://{d.unix_socket}"


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_c_cartpole_learns(daemon_factory, built, transport):
    d = daemon_factory()
    result = run_cartpole(built / "cartpole", address(d, transport), "--agents", "8",
                          "--target", "450", "--max-seconds", "200")
    assert result["solved"] and result["exit"] == 0, result
    status = d.status()
    assert status["env_steps"] > 0 and status["inference"]["actions"] >= result["steps"] * 0.9


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_c_client_survives_a_daemon_restart(daemon_factory, built, transport, tmp_path):
    port = free_port()
    runtime = ("--set", f"daemon.runtime_dir={tmp_path / 'run'}")  # (the same socket path twice)
    d = daemon_factory("--port", str(port), *runtime, check_clean_exit=False)  # (killed below)
    results: list[dict] = []
    runner = threading.Thread(target=lambda: results.append(run_cartpole(
        built / "san" / "cartpole", address(d, transport), "--agents", "4", "--target", "1e9",
        "--max-seconds", "25")))
    runner.start()
    wait_for(lambda: d.status()["env_steps"] > 2000, 60, what="the C client training")
    d.signal(signal.SIGKILL)  # the supervisor dies at once; its children follow it
    d.proc.wait(30)
    d.kill_leftovers()
    d2 = daemon_factory("--port", str(port), *runtime, name="state2")
    wait_for(lambda: d2.status()["env_steps"] > 500, 60, what="the C client back on the new daemon")
    runner.join(120)
    result = results[0]
    assert result["status"] == "RLK_OK" and result["reconnects"] >= 1, result
    assert "runtime error" not in result["stderr"] and "AddressSanitizer" not in result["stderr"]
