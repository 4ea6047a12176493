"""The C client (client_lib/c) against a real daemon: its CartPole, written in C, learns
through server-side actions over TCP and over shared-memory lanes and with client-side
inference over shared memory; a daemon restart mid-run is survived in every variant (the
client reconnects and its episodes go on). The library and the example are built here with
the client's own Makefile (AddressSanitizer + UndefinedBehaviorSanitizer for the restart test,
so real traffic runs under the sanitizers too)."""
from __future__ import annotations

import json
import signal
import subprocess
import threading

import pytest

from rlinkd.daemon.inference.netnative import native_module
from tests.helpers import REPO, free_port, settled, wait_for

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

C_DIR = REPO / "client_lib" / "c"


@pytest.fixture(scope="module")
def built(c_build):
    """The optimised and the sanitized example (a compiler error fails here)."""
    return c_build("all", "san/cartpole")


def run_cartpole(binary, address: str, *args: str, timeout_s: float = 240.0) -> dict:
    """The example until it exits; its final JSON line (the progress lines before it)."""
    proc = subprocess.run([str(binary), address, *args], capture_output=True, text=True,
                          timeout=timeout_s)
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr
    return json.loads(lines[-1]) | {"exit": proc.returncode, "stderr": proc.stderr}


VARIANTS = ("tcp", "shm", "shm-client")
"""Server-side actions over TCP and over shared-memory lanes; client-side inference (the
policy run in the C client on the board's weights, steps written into its ring)."""


def variant_args(d, variant: str) -> list[str]:
    if variant == "tcp":
        return [f"tcp://127.0.0.1:{d.port}"]
    return [f"shm://{d.unix_socket}"] + (["--inference", "client"] if variant == "shm-client" else [])


def run_all(binary, d, *args: str) -> dict[str, dict]:
    """The example in every variant at once (three processes, one daemon)."""
    results: dict[str, dict] = {}
    threads = [threading.Thread(target=lambda v=v: results.__setitem__(v, run_cartpole(
        binary, *variant_args(d, v), *args))) for v in VARIANTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(280)
    return results


def test_c_cartpole_learns_in_every_variant(daemon_factory, built):
    d = daemon_factory()
    results = run_all(built / "cartpole", d, "--agents", "8", "--target", "450", "--max-seconds", "200")
    assert set(results) == set(VARIANTS), results
    for variant, result in results.items():
        assert result["solved"] and result["exit"] == 0, (variant, result)
    status = d.status()
    served = sum(results[v]["steps"] for v in ("tcp", "shm"))
    assert status["env_steps"] >= sum(r["steps"] for r in results.values()) * 0.9
    # (the inference role reports its counts every daemon.status_interval_s: wait for the report)
    wait_for(lambda: d.status()["inference"].get("actions", 0) >= served * 0.9, 20,
             what="the inference role's report of the served actions")
    evaluation_contributes_no_training_data(built / "cartpole", d)


def evaluation_contributes_no_training_data(binary, d) -> None:
    """Greedy C clients (client-side over shared memory, server-side over TCP) after training:
    their episodes reach the eval counters, the training counters do not move."""
    # (settled: unchanged for longer than a status report's period plus the records' coalescing)
    trained = settled(lambda: d.status()["env_steps"], 2.5, 30, what="the training steps")
    runs = [run_cartpole(binary, *variant_args(d, v), "--agents", "4", "--target", "1e9",
                         "--max-steps", "4000", "--evaluate", "1") for v in ("shm-client", "tcp")]
    episodes = sum(r["episodes"] for r in runs)
    assert all(r["status"] == "RLK_OK" for r in runs), runs
    assert runs[0]["mean_return_20"] >= 300, runs[0]  # (the trained policy, greedy)
    status = wait_for(lambda: (s := d.status())["eval"].get("episodes", 0) >= episodes and s, 20,
                      what="the evaluation episodes reported")
    assert status["env_steps"] == trained, status



@pytest.mark.skipif(native_module() is None, reason="the _native extension is not built")
def test_a_one_agent_tcp_client_is_served_by_the_native_direct_path(daemon_factory, built):
    """One agent's STEP_BATCHes of one plain step (the C client's common case) are read,
    published and answered by the role's native code (fastpath.py); only each episode's
    END + START, and the step after it, go through Python."""
    d = daemon_factory()
    before = d.status()["inference"].get("direct_native_messages", 0)
    run = run_cartpole(built / "cartpole", f"tcp://127.0.0.1:{d.port}", "--agents", "1", "--target", "1e9",
                       "--max-steps", "3000")
    assert run["status"] == "RLK_OK" and run["steps"] >= 3000, run
    wait_for(lambda: d.status()["inference"].get("direct_native_messages", 0) - before >= 0.6 * run["steps"],
             20, what=f"most of {run['steps']} steps served natively ({run['episodes']} episodes)")


RESTART_MAX_STEPS = 4000


def test_c_client_survives_a_daemon_restart(daemon_factory, built, tmp_path):
    """Every variant at once; the daemon is SIGKILLed mid-run and a new one started on the
    same port and socket path (the sanitized build: real traffic under ASan + UBSan)."""
    port = free_port()
    runtime = ("--set", f"daemon.runtime_dir={tmp_path / 'run'}")  # (the same socket path twice)
    d = daemon_factory("--port", str(port), *runtime, check_clean_exit=False)  # (killed below)
    results: dict[str, dict] = {}
    # (each client stops after MAX_STEPS of its own, at the latest after 25 s: the kill comes
    # at 2,000 steps of all three together, so each does thousands more on the new daemon)
    runner = threading.Thread(target=lambda: results.update(run_all(
        built / "san" / "cartpole", d, "--agents", "4", "--target", "1e9",
        "--max-steps", str(RESTART_MAX_STEPS), "--max-seconds", "25")))
    runner.start()
    wait_for(lambda: d.status()["env_steps"] > 2000, 60, what="the C clients training")
    d.signal(signal.SIGKILL)  # the supervisor dies at once; its children follow it
    d.proc.wait(30)
    d.kill_leftovers()
    d2 = daemon_factory("--port", str(port), *runtime, name="state2")
    wait_for(lambda: d2.status()["env_steps"] > 500, 60, what="the C clients back on the new daemon")
    runner.join(120)
    assert set(results) == set(VARIANTS), results
    for variant, result in results.items():
        assert result["status"] == "RLK_OK" and result["reconnects"] >= 1, (variant, result["stderr"][-800:], result)
        assert "runtime error" not in result["stderr"] and "AddressSanitizer" not in result["stderr"]



def test_c_client_acts_server_side_with_a_recurrent_policy(daemon_factory, built):
    """A GRU policy: server-side actions (TCP and shared-memory lanes) work unchanged, the
    inference role keeping each episode's state. Acting only (force_on_policy off: nothing
    waits for training)."""
    d = daemon_factory("--set", "ppo.recurrent=gru", "--set", "ppo.recurrent_size=8",
                       "--set", "sampling.force_on_policy=false")
    runs = {v: run_cartpole(built / "cartpole", *variant_args(d, v), "--agents", "2", "--target", "1e9",
                            "--max-steps", "600", timeout_s=60) for v in ("tcp", "shm")}
    for variant, run in runs.items():
        assert run["status"] == "RLK_OK" and run["steps"] >= 600, (variant, run)
    assert d.status()["protocol_errors"] == 0


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_c_client_side_inference_trains_a_recurrent_policy(daemon_factory, built, cell):
    """Client-side inference with memory (the sanitized build): the C client carries each
    agent's state and writes its records on the state grid (L = 7, cut by samples of 300
    steps at other positions); the collector takes them all and the learner trains on them
    (force_on_policy: every sample waits for its update). A greedy evaluation client acts
    with the trained policy, carrying the state as well."""
    d = daemon_factory("--set", f"ppo.recurrent={cell}", "--set", "ppo.recurrent_size=8",
                       "--set", "ppo.max_seq_len=7", "--set", "sampling.env_steps_per_sample=300",
                       "--set", "sampling.train_batch_size=600", "--set", "ppo.minibatch_size=200",
                       "--set", "ppo.num_epochs=2")
    run = run_cartpole(built / "san" / "cartpole", *variant_args(d, "shm-client"), "--agents", "3",
                       "--target", "1e9", "--max-steps", "3000", timeout_s=90)
    assert run["status"] == "RLK_OK" and run["steps"] >= 3000, run  # (exit 1: not solved, as expected)
    assert "runtime error" not in run["stderr"] and "AddressSanitizer" not in run["stderr"], run["stderr"]
    status = wait_for(lambda: (s := d.status())["learner"].get("updates", 0) >= 4 and s, 30,
                      what="the learner's updates on the C client's records")
    assert status["protocol_errors"] == 0 and status["env_steps"] >= 2700, status
    assert "ring records" not in d.log()  # (no ring refused: the state grid held)
    greedy = run_cartpole(built / "san" / "cartpole", *variant_args(d, "shm-client"), "--agents", "2",
                          "--target", "1e9", "--max-steps", "400", "--evaluate", "1", timeout_s=60)
    assert greedy["status"] == "RLK_OK" and greedy["episodes"] >= 1, greedy  # (evaluation carries it too)
    assert "runtime error" not in greedy["stderr"] and "AddressSanitizer" not in greedy["stderr"], greedy["stderr"]
