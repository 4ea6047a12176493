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


def run_both(binary, d, *args: str) -> dict[str, dict]:
    """The example over TCP and over shared memory at once (two processes, one daemon)."""
    results: dict[str, dict] = {}
    threads = [threading.Thread(target=lambda t=t: results.__setitem__(t, run_cartpole(
        binary, address(d, t), *args))) for t in ("tcp", "shm")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(280)
    return results


def test_c_cartpole_learns_over_tcp_and_shared_memory(daemon_factory, built):
    d = daemon_factory()
    results = run_both(built / "cartpole", d, "--agents", "8", "--target", "450", "--max-seconds", "200")
    assert set(results) == {"tcp", "shm"}, results
    for transport, result in results.items():
        assert result["solved"] and result["exit"] == 0, (transport, result)
    status = d.status()
    steps = sum(r["steps"] for r in results.values())
    assert status["env_steps"] > 0 and status["inference"]["actions"] >= steps * 0.9


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_c_client_survives_a_daemon_restart(daemon_factory, built, tmp_path):
    """Both transports at once; the daemon is SIGKILLed mid-run and a new one started on the
    same port and socket path (the sanitized build: real traffic under ASan + UBSan)."""
    port = free_port()
    runtime = ("--set", f"daemon.runtime_dir={tmp_path / 'run'}")  # (the same socket path twice)
    d = daemon_factory("--port", str(port), *runtime, check_clean_exit=False)  # (killed below)
    results: dict[str, dict] = {}
    runner = threading.Thread(target=lambda: results.update(run_both(
        built / "san" / "cartpole", d, "--agents", "4", "--target", "1e9", "--max-seconds", "25")))
    runner.start()
    wait_for(lambda: d.status()["env_steps"] > 2000, 60, what="the C clients training")
    d.signal(signal.SIGKILL)  # the supervisor dies at once; its children follow it
    d.proc.wait(30)
    d.kill_leftovers()
    d2 = daemon_factory("--port", str(port), *runtime, name="state2")
    wait_for(lambda: d2.status()["env_steps"] > 500, 60, what="the C clients back on the new daemon")
    runner.join(120)
    assert set(results) == {"tcp", "shm"}, results
    for transport, result in results.items():
        assert result["status"] == "RLK_OK" and result["reconnects"] >= 1, (transport, result)
        assert "runtime error" not in result["stderr"] and "AddressSanitizer" not in result["stderr"]


def test_c_cartpole_learns_with_client_side_inference(daemon_factory, built):
    """The C client runs the policy itself (MLP from ATTACHED's description, weights from the
    board) and writes step records into its ring: the same CartPole reaches 450."""
    d = daemon_factory()
    result = run_cartpole(built / "cartpole", f"shm://{d.unix_socket}", "--agents", "8", "--target", "450",
                          "--max-seconds", "200", "--inference", "client", "--seed", "3")
    assert result["solved"] and result["exit"] == 0, result
    assert result["status"] == "RLK_OK", result
