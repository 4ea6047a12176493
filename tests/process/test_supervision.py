"""Supervision with real processes: hung children, crash loops, a forced exit, metrics."""
from __future__ import annotations

import os
import signal

import gymnasium as gym
import pytest

from rlinkd.client_lib import run_env
from rlinkd.daemon.tboard import read_events
from tests.helpers import BackgroundClient, wait_for

pytestmark = pytest.mark.process


def test_hung_child_gets_sigabrt_then_sigkill_then_restart(daemon_factory):
    d = daemon_factory("--set", "daemon.heartbeat_timeout_s=2")
    before = d.status()["children"]["connector"]
    os.kill(before["pid"], signal.SIGSTOP)  # alive but silent: no heartbeats
    status = wait_for(lambda: (s := d.status())["children"]["connector"]["restarts"]
                      > before["restarts"] and s["children"]["connector"]["alive"] and s, 30,
                      what="restart")
    assert status["children"]["connector"]["pid"] != before["pid"]
    log = d.log_tail(1 << 24)  # all of it: the aborted child's stack dump may be long
    assert '"signal": "SIGABRT"' in log and '"signal": "SIGKILL"' in log
    assert log.index('"signal": "SIGABRT"') < log.index('"signal": "SIGKILL"')
    d.remember_children()


def connector_pid(d) -> int | None:
    """The live connector's pid, or None while restarting (or once the daemon stops)."""
    try:
        child = d.status()["children"]["connector"]
    except (OSError, KeyError, ValueError):
        return None
    return child["pid"] if child["alive"] else None


def test_crash_loop_stops_the_daemon_with_one_clear_line(daemon_factory):
    d = daemon_factory("--set", "daemon.crash_loop_restarts=2",
                       "--set", "daemon.restart_backoff_s=0.05", check_clean_exit=False)
    for _ in range(3):
        pid = wait_for(lambda: connector_pid(d), 30, what="connector up")
        d.remember_children()
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: d.proc.poll() is not None or connector_pid(d) not in (None, pid),  # noqa: B023 - polled before the loop moves on
                 30, what="restart or exit")
    assert d.proc.wait(60) == 4  # ExitCode.CRASH_LOOP
    lines = [line for line in d.log().splitlines() if '"event": "crash_loop"' in line]
    assert len(lines) == 1 and "connector crashed more than 2 times" in lines[0]


def test_second_sigint_forces_exit(daemon_factory):
    d = daemon_factory(check_clean_exit=False)
    client = BackgroundClient(f"tcp://127.0.0.1:{d.port}", reconnect_timeout_s=1).start()
    wait_for(lambda: d.status()["env_steps"] > 0, 30, what="training")
    checkpointer = d.status()["children"]["checkpointer"]["pid"]
    os.kill(checkpointer, signal.SIGSTOP)  # the final checkpoint cannot finish
    d.signal(signal.SIGINT)
    wait_for(lambda: '"event": "stopping"' in d.log(), 30, what="graceful stop begun")
    d.signal(signal.SIGINT)
    assert d.proc.wait(30) == 130
    client.stop()


def tensorboard_tags_by_step(state_dir) -> dict[int, set[str]]:
    """{step: scalar tags written at that step} of the daemon's event file; {} while the
    file is missing or ends mid-record (being written)."""
    path = next((state_dir / "tensorboard").glob("events.out.tfevents.*"), None)
    try:
        events = read_events(path) if path else []
    except ValueError:
        return {}
    tags: dict[int, set[str]] = {}
    for event in events:
        tags.setdefault(event["step"], set()).update(event.get("scalars", {}))
    return tags


def test_tensorboard_events_and_box_actions(daemon_factory):
    d = daemon_factory("--env", "Pendulum-v1", "--set", "sampling.env_steps_per_sample=200",
                       "--set", "sampling.train_batch_size=400", "--set", "ppo.minibatch_size=100",
                       "--set", "daemon.status_interval_s=0.2")
    stats = run_env(gym.make("Pendulum-v1"), f"tcp://127.0.0.1:{d.port}", steps=1200, seed=0)
    assert stats.episodes == 6  # Pendulum truncates at 200 steps
    status = wait_for(lambda: (s := d.status())["weights_seq_no"] >= 4 and s, 30, what="updates")
    assert status["learner"]["n_rows"] > 0
    wanted = {"episode/return_mean", "episode/length_mean", "learner/policy_loss", "learner/value_loss",
              "learner/approx_kl", "learner/entropy", "learner/policy_lag", "learner/policy_lag_mean",
              "throughput/env_steps_per_s", "clients/connected"}
    # the file is written as status reports arrive: wait for the report of the last step
    steps = wait_for(lambda: (t := tensorboard_tags_by_step(d.state_dir)) and max(t) == 1200 and t, 30,
                     what="a TensorBoard event at step 1200")
    assert wanted <= set().union(*steps.values()), wanted - set().union(*steps.values())


def test_collector_restart_keeps_the_port_and_clients_reconnect(daemon):
    client = BackgroundClient(f"tcp://127.0.0.1:{daemon.port}", reconnect_timeout_s=60).start()
    wait_for(lambda: daemon.status()["weights_seq_no"] >= 2, 60, what="training")
    pid = daemon.status()["children"]["collector"]["pid"]
    os.kill(pid, signal.SIGKILL)

    def back() -> dict | None:
        try:
            s = daemon.status()
        except (OSError, KeyError, ValueError):
            return None
        collector = s.get("children", {}).get("collector", {})
        return s if collector.get("pid") not in (None, pid) and s["clients"] == 1 else None

    status = wait_for(back, 60, what="collector restarted and client back")
    assert status["port"] == daemon.port  # port 0 was resolved once and kept
    steps = status["env_steps"]
    wait_for(lambda: daemon.status()["env_steps"] > steps, 30, what="training resumes")
    assert client.error is None and client.agent.link.reconnects >= 1
    client.stop()
    daemon.remember_children()
