"""daemon.children: restart backoff, crash-loop rule and hang escalation over RoleState
(no processes), and the Child process handle with a fake process."""
from __future__ import annotations

import signal

import pytest

from rlinkd.daemon import children
from rlinkd.daemon.children import (ABORT_GRACE_S, HEALTHY_AFTER_S, Child, RoleState, hang_action,
                                    in_crash_loop, is_boot_error, schedule_restart)
from rlinkd.daemon.errors import ExitCode


def role_state(role: str = "learner", alive: bool = True, started_at: float = 0.0) -> RoleState:
    """A role's restart state, running as long as the test says so."""
    return RoleState(role=role, running=alive, started_at=started_at)


def test_backoff_doubles_up_to_the_cap():
    child = role_state(started_at=1000.0)
    delays, now = [], 1000.0
    for _ in range(7):
        now += 1.0
        delays.append(schedule_restart(child, now, initial_s=0.5, max_s=5.0))
        assert child.restart_at == pytest.approx(now + delays[-1])
        child.started_at = child.restart_at          # restarted, crashes again a second later
    assert delays == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    assert list(child.crash_times) == [1001.0 + i for i in range(7)]


def test_backoff_resets_after_a_healthy_run():
    child = role_state(started_at=0.0)
    for t in (1.0, 2.0, 3.0):
        schedule_restart(child, t, 1.0, 30.0)
    assert child.backoff_s == 4.0
    child.started_at = 10.0
    assert schedule_restart(child, 10.0 + HEALTHY_AFTER_S + 1.0, 1.0, 30.0) == 1.0
    # exactly at the threshold is not yet "healthy"
    child.started_at = 100.0
    schedule_restart(child, 101.0, 1.0, 30.0)
    assert schedule_restart(child, 100.0 + HEALTHY_AFTER_S, 1.0, 30.0) == 4.0


def test_backoff_with_zero_initial_delay():
    child = role_state(started_at=1.0)
    assert schedule_restart(child, 2.0, 0.0, 30.0) == 0.0
    assert child.restart_at == 2.0


def test_never_started_child_does_not_reset():
    child = role_state(started_at=0.0)
    schedule_restart(child, 500.0, 1.0, 10.0)
    assert schedule_restart(child, 1000.0, 1.0, 10.0) == 2.0


def test_in_crash_loop_counts_crashes_in_the_window():
    child = role_state()
    for t in (0.0, 10.0, 20.0, 30.0, 40.0):
        child.crash_times.append(t)
    assert not in_crash_loop(child, 40.0, max_restarts=5, window_s=60.0)   # 5 is not more than 5
    child.crash_times.append(50.0)
    assert in_crash_loop(child, 50.0, max_restarts=5, window_s=60.0)
    assert not in_crash_loop(child, 71.0, max_restarts=5, window_s=60.0)   # 0 and 10 aged out
    assert in_crash_loop(child, 60.0, max_restarts=5, window_s=60.0)      # window inclusive


def test_crash_loop_through_schedule_restart():
    child = role_state(started_at=0.0)
    looping = []
    for i in range(4):
        schedule_restart(child, float(i), 0.1, 1.0)
        looping.append(in_crash_loop(child, float(i), max_restarts=3, window_s=60.0))
    assert looping == [False, False, False, True]


def test_is_boot_error():
    assert is_boot_error(ExitCode.BOOT_ERROR) and is_boot_error(ExitCode.CONFIG)
    assert is_boot_error(3) and is_boot_error(78)
    assert not any(is_boot_error(c) for c in (0, 1, -9, None, ExitCode.CRASH))


# ---------------------------------------------------------------- hangs
def test_hang_action_abort_then_kill_after_grace():
    child = role_state()
    assert hang_action(child, heartbeat_age_s=29.0, timeout_s=30.0, now=100.0) is None
    assert hang_action(child, 30.0, 30.0, now=100.0) is None            # not beyond the timeout
    assert hang_action(child, 31.0, 30.0, now=100.0) == signal.SIGABRT
    assert child.abort_sent_at == 100.0
    assert hang_action(child, 32.0, 30.0, now=101.0) is None            # within the grace
    assert hang_action(child, 36.0, 30.0, now=100.0 + ABORT_GRACE_S) is None
    assert hang_action(child, 37.0, 30.0, now=100.0 + ABORT_GRACE_S + 0.1) == signal.SIGKILL
    assert hang_action(child, 38.0, 30.0, now=100.0 + ABORT_GRACE_S + 1.0) == signal.SIGKILL


def test_hang_action_ignores_dead_children():
    child = role_state(alive=False)
    assert hang_action(child, 1e9, 30.0, now=0.0) is None and child.abort_sent_at is None


def test_hang_action_grace_is_the_module_constant(monkeypatch):
    monkeypatch.setattr(children, "ABORT_GRACE_S", 0.5)
    child = role_state()
    assert hang_action(child, 99.0, 1.0, now=10.0) == signal.SIGABRT
    assert hang_action(child, 99.0, 1.0, now=10.6) == signal.SIGKILL


def test_child_start_spawns_a_named_process(monkeypatch):
    class FakeProcess:
        pid, sentinel = 4321, 99

        def __init__(self, target, args, name):
            self.name, self.started = name, False

        def start(self):
            self.started = True

        def is_alive(self):
            return self.started

    class FakeContext:
        Process = FakeProcess

    monkeypatch.setattr(children.mp, "get_context", lambda method: FakeContext)
    child = Child(role="collector")
    child.start(target=None, args=())
    assert child.alive() and child.pid == 4321 and child.sentinel() == 99
    assert child.process.name == "rlinkd-collector"


def test_mark_started_resets_restart_and_abort_state():
    state = RoleState(role="collector", restart_at=5.0, abort_sent_at=3.0)
    state.mark_started(7.0)
    assert state.running and state.started_at == 7.0
    assert state.restart_at is None and state.abort_sent_at is None
    state.mark_exited(-9)
    assert not state.running and state.last_exit == -9


def test_child_without_process():
    child = Child(role="x")
    assert not child.alive() and child.pid is None and child.sentinel() is None
    assert child.reap() is None
    child.signal(signal.SIGTERM)  # no process: nothing happens, no error
