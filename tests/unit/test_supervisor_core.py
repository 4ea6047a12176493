"""daemon.supervisor_core: the shutdown state machine and restart policy, driven by events and
a fake clock (no processes, sockets or signals); plus the shell's loop boundary and its
non-blocking sends, with the processes left out."""
from __future__ import annotations

import dataclasses
import os
import signal
import time
from typing import ClassVar

import pytest
from structlog.testing import capture_logs

from rlinkd.daemon import messages as m
from rlinkd.daemon.children import ABORT_GRACE_S, HEALTHY_AFTER_S
from rlinkd.daemon.config import (ClusterConfig, DaemonConfig, load_config, reloadable_changes,
                                  writes_checkpoints)
from rlinkd.daemon.errors import ExitCode
from rlinkd.daemon.roster import ROLES, START_ORDER
from rlinkd.daemon.supervisor_core import (INTERRUPTED, Exit, Kill, Phase, Send, ShutdownBegun,
                                           Start, SupervisorCore, drain_exit_code, reload_target)

BUDGET_S = 10.0          # shutdown_timeout_s
CKPT_DEADLINE_S = 7.0    # 70 % of it for the final checkpoint
HEARTBEAT_S = 30.0


def make_core(**settings) -> SupervisorCore:
    base = dict(shutdown_timeout_s=BUDGET_S, heartbeat_timeout_s=HEARTBEAT_S, restart_backoff_s=0.5,
                restart_backoff_max_s=4.0, crash_loop_restarts=5, crash_loop_window_s=60.0)
    core = SupervisorCore(DaemonConfig(**{**base, **settings}))
    core.start_all(0.0)
    return core


def fresh(**ages) -> dict:
    """Heartbeat ages: every role just beat, except those given (TypeError for a non-role)."""
    if unknown := set(ages) - set(ROLES):
        raise TypeError(f"not roles: {sorted(unknown)}")
    return {role: ages.get(role, 0.1) for role in ROLES}


def sent(actions, kind) -> list:
    return [(a.target, a.msg) for a in actions if isinstance(a, Send) and isinstance(a.msg, kind)]


def exits(actions) -> list[int]:
    return [a.code for a in actions if isinstance(a, Exit)]


def final_request_id(actions) -> int:
    [(target, req)] = sent(actions, m.CheckpointRequest)
    assert target == "checkpointer" and req.reason == "shutdown"
    return req.request_id


def events(logs, name) -> list[dict]:
    return [e for e in logs if e["event"] == name]


def finish_stop(core: SupervisorCore, now: float) -> list[int]:
    """Past the final checkpoint's phase: Stop sent, every role exits 0; the exit codes."""
    assert sent(core.tick(now, fresh()), m.Stop)
    for role in ROLES:
        core.child_exited(role, 0, now)
    return exits(core.tick(now, fresh()))


# ---------------------------------------------------------------- starting
def test_start_all_in_start_order_learner_first():
    core = SupervisorCore(DaemonConfig())
    actions = core.start_all(5.0)
    assert actions == [Start(role) for role in START_ORDER] and START_ORDER[0] == "learner"
    assert set(START_ORDER) == set(ROLES)
    assert all(s.running and s.started_at == 5.0 for s in core.roles.values())
    assert core.tick(6.0, fresh()) == []


# ---------------------------------------------------------------- shutdown phases
@pytest.mark.parametrize("signal_name", ["terminate", "interrupt"])
def test_graceful_stop_drain_checkpoint_stop_exit_0(signal_name):
    core = make_core()
    actions = getattr(core, signal_name)(100.0)
    reason = {"terminate": "SIGTERM", "interrupt": "SIGINT"}[signal_name]
    assert actions[0] == ShutdownBegun(reason)
    assert sent(actions, m.Drain) == [("collector", m.Drain(reason))]
    rid = final_request_id(actions)
    assert core.phase is Phase.CHECKPOINT and core.stopping == reason
    assert core.tick(101.0, fresh()) == []                  # waiting for the final checkpoint
    core.checkpoint_finished(rid, None)
    actions = core.tick(101.5, fresh())
    assert sent(actions, m.Stop) == [(role, m.Stop(reason)) for role in START_ORDER]
    assert core.phase is Phase.STOP
    with capture_logs() as exits:
        for i, role in enumerate(ROLES):
            assert core.tick(102.0, fresh()) == []              # someone is still running
            assert core.child_exited(role, 0, 102.0 + i) == []  # no restart while stopping
    assert [(e["log_level"], e["requested"]) for e in events(exits, "child_exited")] == [("info", True)] * len(ROLES)
    with capture_logs() as logs:
        assert core.tick(106.0, fresh()) == [Exit(0)]
    assert events(logs, "stopped")[0]["exit_code"] == 0
    assert core.phase is Phase.DONE and core.tick(107.0, fresh()) == []


def test_begin_shutdown_is_idempotent_first_reason_and_code_win():
    core = make_core()
    core.begin_shutdown("connector failed to start", ExitCode.BOOT_ERROR, 1.0)
    assert core.terminate(2.0) == [] and core.begin_shutdown("x", ExitCode.CRASH_LOOP, 3.0) == []
    assert core.stopping == "connector failed to start" and core.pending_exit == ExitCode.BOOT_ERROR


def test_other_checkpoints_do_not_end_the_wait_for_the_final_one():
    core = make_core()
    [(_, periodic)] = sent(core.request_checkpoint("periodic"), m.CheckpointRequest)
    rid = final_request_id(core.terminate(0.0))
    assert rid != periodic.request_id
    core.checkpoint_finished(periodic.request_id, None)
    assert core.tick(1.0, fresh()) == []
    core.checkpoint_finished(rid, None)
    assert sent(core.tick(1.1, fresh()), m.Stop)


def test_no_checkpoint_requests_once_stopping():
    core = make_core()
    first = sent(core.request_checkpoint("SIGUSR1"), m.CheckpointRequest)[0][1].request_id
    second = sent(core.request_checkpoint("periodic"), m.CheckpointRequest)[0][1].request_id
    assert second == first + 1
    core.terminate(0.0)
    assert core.request_checkpoint("SIGUSR1") == [] and core.request_checkpoint("periodic") == []


def test_final_checkpoint_timeout_stops_the_roles_at_70_percent():
    core = make_core()
    core.terminate(100.0)
    assert core.tick(100.0 + CKPT_DEADLINE_S - 0.01, fresh()) == []
    with capture_logs() as logs:
        actions = core.tick(100.0 + CKPT_DEADLINE_S, fresh())
    assert len(sent(actions, m.Stop)) == len(ROLES)
    [line] = events(logs, "final_checkpoint_not_written")
    assert line["timed_out"] is True and line["writers_alive"] is True
    assert core.final_ckpt_id is None


@pytest.mark.parametrize("writer", ["learner", "checkpointer"])
def test_writer_dying_during_shutdown_ends_the_checkpoint_wait(writer):
    core = make_core()
    core.terminate(0.0)
    assert core.child_exited(writer, -9, 1.0) == []          # no restart while stopping
    with capture_logs() as logs:
        actions = core.tick(1.0, fresh())
    assert len(sent(actions, m.Stop)) == len(ROLES)
    [line] = events(logs, "final_checkpoint_not_written")
    assert line["timed_out"] is False and line["writers_alive"] is False
    assert core.roles[writer].restart_at is None


def test_writers_already_dead_no_final_checkpoint_is_asked():
    core = make_core()
    core.child_exited("checkpointer", 1, 0.0)                # crashed: restart scheduled at 0.5
    actions = core.terminate(0.2)
    assert sent(actions, m.CheckpointRequest) == [] and core.final_ckpt_id is None
    with capture_logs() as logs:
        actions = core.tick(0.3, fresh())
    assert len(sent(actions, m.Stop)) == len(ROLES)
    assert not events(logs, "final_checkpoint_not_written")
    assert not [a for a in core.tick(5.0, fresh()) if isinstance(a, Start)]  # never restarted


def test_undeliverable_final_checkpoint_moves_on_at_once():
    core = make_core()
    rid = final_request_id(core.terminate(0.0))
    core.checkpoint_finished(rid, "checkpointer inbox full")  # what the shell does on a full inbox
    assert sent(core.tick(0.01, fresh()), m.Stop)


def test_deadline_kills_only_the_roles_still_running_and_exits():
    core = make_core()
    core.checkpoint_finished(final_request_id(core.terminate(100.0)), None)
    core.tick(101.0, fresh())                                # Stop sent
    for role in ("learner", "connector", "checkpointer", "inference"):
        core.child_exited(role, 0, 102.0)
    assert core.tick(100.0 + BUDGET_S - 0.01, fresh()) == []
    with capture_logs() as logs:
        actions = core.tick(100.0 + BUDGET_S, fresh())
    assert actions == [Kill("collector", signal.SIGKILL), Exit(ExitCode.DRAIN_KILLED)]
    assert [e["child"] for e in events(logs, "child_killed_at_deadline")] == ["collector"]
    [line] = events(logs, "drain_incomplete")
    assert line["log_level"] == "error" and line["killed"] == ["collector"]
    assert line["final_checkpoint"] == "written" and not events(logs, "stopped")
    assert core.tick(200.0, fresh()) == []


# ---------------------------------------------------------------- the exit code of a stop
@pytest.mark.parametrize("pending, failure, killed, code", [
    (ExitCode.OK, None, [], ExitCode.OK),
    (ExitCode.OK, "disk full", [], ExitCode.DRAIN_NO_CHECKPOINT),
    (ExitCode.OK, None, ["collector"], ExitCode.DRAIN_KILLED),
    (ExitCode.OK, "disk full", ["collector"], ExitCode.DRAIN_NO_CHECKPOINT),  # the state lost first
    (ExitCode.CRASH_LOOP, "disk full", ["learner"], ExitCode.CRASH_LOOP),    # why it stopped wins
    (ExitCode.BOOT_ERROR, None, [], ExitCode.BOOT_ERROR)])
def test_drain_exit_code(pending, failure, killed, code):
    assert drain_exit_code(pending, failure, killed) == code


def test_the_exit_codes_of_an_incomplete_drain_are_distinct_and_not_success():
    values = [int(c) for c in ExitCode.__members__.values()]  # (aliases: a repeated value)
    assert len(set(values)) == len(values) and ExitCode.DRAIN_NO_CHECKPOINT != ExitCode.DRAIN_KILLED
    assert {ExitCode.DRAIN_NO_CHECKPOINT, ExitCode.DRAIN_KILLED}.isdisjoint({0, INTERRUPTED})


def test_a_failed_final_checkpoint_exits_74_with_one_error_line_naming_why():
    core = make_core()
    rid = final_request_id(core.terminate(100.0))
    core.checkpoint_finished(rid, "[Errno 20] Not a directory: 'checkpoints'")
    with capture_logs() as logs:
        assert finish_stop(core, 101.0) == [ExitCode.DRAIN_NO_CHECKPOINT]
    [line] = [e for e in logs if e["log_level"] == "error"]
    assert line["event"] == "drain_incomplete" and line["exit_code"] == 74 and line["killed"] == []
    assert line["final_checkpoint"] == "[Errno 20] Not a directory: 'checkpoints'"


def test_a_final_checkpoint_past_its_deadline_exits_74_unless_it_is_written_after_all():
    core = make_core()
    final_request_id(core.terminate(100.0))
    assert sent(core.tick(100.0 + CKPT_DEADLINE_S, fresh()), m.Stop)  # timed out: Stop sent
    assert core.final_failure == f"not written within {CKPT_DEADLINE_S:g} s"
    late = make_core()
    late_rid = final_request_id(late.terminate(100.0))
    late.tick(100.0 + CKPT_DEADLINE_S, fresh())
    late.checkpoint_finished(late_rid, None)                 # written while the roles stop
    for c in (core, late):
        for role in ROLES:
            c.child_exited(role, 0, 108.0)
    assert exits(core.tick(108.0, fresh())) == [ExitCode.DRAIN_NO_CHECKPOINT]
    assert exits(late.tick(108.0, fresh())) == [0]


@pytest.mark.parametrize("before_the_stop", [True, False])
def test_writers_not_running_at_the_stop_exit_74(before_the_stop):
    core = make_core()
    if before_the_stop:
        core.child_exited("learner", 1, 0.0)                 # crashed: restart scheduled
    core.terminate(0.2)
    if not before_the_stop:
        core.child_exited("checkpointer", -9, 0.3)
    with capture_logs() as logs:
        assert finish_stop(core, 0.4) == [ExitCode.DRAIN_NO_CHECKPOINT]
    [line] = events(logs, "drain_incomplete")
    assert "learner or the checkpointer" in line["final_checkpoint"]


def test_deadline_exit_keeps_the_pending_code():
    core = make_core(crash_loop_restarts=1)
    core.child_exited("connector", 1, 0.0)
    core.child_exited("connector", 1, 1.0)                   # crash loop: graceful stop, code 4
    core.checkpoint_finished(core.final_ckpt_id, None)
    core.tick(1.0, fresh())
    assert exits(core.tick(1.0 + BUDGET_S, fresh())) == [ExitCode.CRASH_LOOP]


# ---------------------------------------------------------------- SIGINT
@pytest.mark.parametrize("phase_steps", [0, 1])
def test_second_sigint_forces_exit_130_in_any_shutdown_phase(phase_steps):
    core = make_core()
    rid = final_request_id(core.interrupt(0.0))
    if phase_steps:
        core.checkpoint_finished(rid, None)
        core.tick(0.1, fresh())
        assert core.phase is Phase.STOP
    with capture_logs() as logs:
        assert core.interrupt(0.2) == [Exit(INTERRUPTED)]
    assert INTERRUPTED == 130 and events(logs, "forced_exit")
    assert core.phase is Phase.DONE
    assert core.interrupt(0.3) == [] and core.tick(0.3, fresh()) == []


def test_sigint_after_sigterm_forces_exit_too():
    core = make_core()
    core.terminate(0.0)
    assert core.interrupt(1.0) == [Exit(INTERRUPTED)]


# ---------------------------------------------------------------- boot errors
@pytest.mark.parametrize("code", [ExitCode.BOOT_ERROR, ExitCode.CONFIG])
def test_boot_error_stops_the_daemon_with_its_code(code):
    core = make_core()
    with capture_logs() as logs:
        actions = core.child_exited("learner", int(code), 3.0)
    assert events(logs, "boot_error_stopping")[0]["child"] == "learner"
    assert ShutdownBegun("learner failed to start") in actions and sent(actions, m.Drain)
    assert sent(actions, m.CheckpointRequest) == []          # the learner is gone: no checkpoint
    assert core.roles["learner"].restart_at is None
    assert len(sent(core.tick(3.1, fresh()), m.Stop)) == len(ROLES)
    for role in ("collector", "connector", "checkpointer", "inference"):
        core.child_exited(role, 0, 3.5)
    assert core.tick(3.6, fresh()) == [Exit(code)]  # a config error stays exit 78


def test_boot_error_during_shutdown_changes_nothing():
    core = make_core()
    core.terminate(0.0)
    with capture_logs() as logs:
        assert core.child_exited("connector", int(ExitCode.BOOT_ERROR), 1.0) == []
    assert not events(logs, "boot_error_stopping") and core.pending_exit == 0
    assert core.roles["connector"].restart_at is None and core.stopping == "SIGTERM"


# ---------------------------------------------------------------- restarts
def test_crash_restarts_after_the_backoff():
    core = make_core()
    with capture_logs() as logs:
        assert core.child_exited("connector", 1, 10.0) == []
    assert events(logs, "restart_scheduled")[0]["delay_s"] == 0.5
    state = core.roles["connector"]
    assert not state.running and state.last_exit == 1 and state.restart_at == 10.5
    assert core.tick(10.49, fresh()) == []
    assert core.tick(10.5, fresh()) == [Start("connector")]
    assert state.running and state.restarts == 1 and state.started_at == 10.5
    assert core.tick(10.6, fresh()) == []                    # started once


def test_killed_by_a_signal_is_a_crash_not_a_boot_error():
    core = make_core()
    assert core.child_exited("learner", -signal.SIGKILL, 1.0) == []
    assert core.stopping is None and core.roles["learner"].restart_at == 1.5


def test_backoff_grows_to_the_cap_and_resets_after_a_healthy_run():
    core = make_core(crash_loop_restarts=50)
    state, now, delays = core.roles["collector"], 1.0, []
    for _ in range(6):
        core.child_exited("collector", 1, now)
        delays.append(state.restart_at - now)
        now = state.restart_at
        assert core.tick(now, fresh()) == [Start("collector")]
        now += 1.0                                           # crashes again a second later
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    now += HEALTHY_AFTER_S                                   # then runs well for a while
    core.child_exited("collector", 1, now)
    assert state.restart_at - now == 0.5
    assert state.restarts == 6


def test_crash_loop_stops_the_daemon_once_with_one_clear_line():
    core = make_core(crash_loop_restarts=3, crash_loop_window_s=60.0)
    now = 0.0
    with capture_logs() as logs:
        for i in range(4):
            actions = core.child_exited("connector", 1, now)
            if i < 3:
                assert actions == [] and core.stopping is None
                now = core.roles["connector"].restart_at
                assert core.tick(now, fresh()) == [Start("connector")]
                now += 0.1
    [line] = events(logs, "crash_loop")
    assert "connector crashed more than 3 times within 60 s" in line["message"]
    assert core.stopping == "connector is crash-looping"
    assert core.pending_exit == ExitCode.CRASH_LOOP
    assert sent(actions, m.Drain) and sent(actions, m.CheckpointRequest)
    assert not [a for a in core.tick(now + 30.0, fresh()) if isinstance(a, Start)]


def test_crashes_spread_beyond_the_window_are_no_loop():
    core = make_core(crash_loop_restarts=2, crash_loop_window_s=10.0)
    for now in (0.0, 6.0, 12.0, 18.0, 24.0):
        assert core.child_exited("learner", 1, now) == []
        core.tick(core.roles["learner"].restart_at, fresh())
    assert core.stopping is None


# ---------------------------------------------------------------- hangs
def test_hang_escalates_sigabrt_then_sigkill_then_restart():
    core = make_core()
    hung = HEARTBEAT_S + 1.0
    with capture_logs() as logs:
        assert core.tick(100.0, fresh(connector=hung)) == [Kill("connector", signal.SIGABRT)]
    assert events(logs, "child_hung")[0]["signal"] == "SIGABRT"
    assert core.tick(101.0, fresh(connector=hung + 1)) == []                  # the grace
    assert core.tick(100.0 + ABORT_GRACE_S, fresh(connector=hung + 5)) == []
    kill = core.tick(100.1 + ABORT_GRACE_S, fresh(connector=hung + 6))
    assert kill == [Kill("connector", signal.SIGKILL)]
    assert core.child_exited("connector", -signal.SIGKILL, 106.0) == []       # an ordinary crash
    assert core.tick(106.5, fresh(connector=hung + 7)) == [Start("connector")]
    # the new process beats; a later hang starts again with SIGABRT
    assert core.tick(107.0, fresh()) == []
    assert core.tick(200.0, fresh(connector=hung)) == [Kill("connector", signal.SIGABRT)]


def test_a_heartbeat_in_the_grace_cancels_the_escalation():
    core = make_core()
    hung = HEARTBEAT_S + 1.0
    assert core.tick(100.0, fresh(learner=hung)) == [Kill("learner", signal.SIGABRT)]
    assert core.tick(101.0, fresh()) == []                                    # it recovered
    again = core.tick(102.0 + ABORT_GRACE_S, fresh(learner=hung))
    assert again == [Kill("learner", signal.SIGABRT)]                         # not SIGKILL


def test_a_role_is_never_hung_longer_than_it_has_run():
    core = make_core()
    assert core.tick(HEARTBEAT_S, fresh(collector=1e6)) == []                 # booted at 0
    assert core.tick(HEARTBEAT_S + 0.5, fresh(collector=1e6)) == [Kill("collector", signal.SIGABRT)]


def test_no_hang_checks_for_stopped_roles_or_while_stopping():
    core = make_core()
    core.child_exited("collector", 1, 0.0)                   # not running, restart pending
    assert core.tick(0.1, fresh(collector=1e6)) == []
    core.terminate(0.2)
    ages = {role: 1e6 for role in ROLES}
    assert not [a for a in core.tick(0.3, ages) if isinstance(a, Kill)]


# ---------------------------------------------------------------- reload with port 0
def test_reload_with_port_0_keeps_the_picked_port():
    started = load_config(overrides=[("server", "port", 0)], resolve_dirs=False)
    pinned = dataclasses.replace(started, server=dataclasses.replace(started.server, port=41234))
    loaded = load_config(overrides=[("server", "port", 0), ("ppo", "lr", 0.001)],
                         resolve_dirs=False)
    applied, needs_restart = reloadable_changes(pinned, reload_target(pinned, loaded, 41234))
    assert applied == {"ppo.lr": 0.001} and needs_restart == []
    moved = load_config(overrides=[("server", "port", 6000)], resolve_dirs=False)
    assert reloadable_changes(pinned, reload_target(pinned, moved, 41234))[1] == ["server.port"]


def test_reload_of_an_explicit_port_to_0_needs_a_restart():
    current = load_config(overrides=[("server", "port", 5555)], resolve_dirs=False)
    loaded = load_config(overrides=[("server", "port", 0)], resolve_dirs=False)
    assert reloadable_changes(current, reload_target(current, loaded, None))[1] == ["server.port"]


def test_reload_keeps_the_directories_fixed_at_start(tmp_path):
    current = load_config(overrides=[("daemon", "state_dir", str(tmp_path / "a"))])
    loaded = load_config(overrides=[("daemon", "state_dir", str(tmp_path / "b"))])
    target = reload_target(current, loaded, None)
    assert target.daemon.state_dir == current.daemon.state_dir
    assert target.daemon.runtime_dir == current.daemon.runtime_dir
    assert reloadable_changes(current, target) == ({}, [])


# ---------------------------------------------------------------- the shell, processes left out
@pytest.fixture
def shell(tmp_path):
    from rlinkd.daemon.ipc import Inbox
    from rlinkd.daemon.sdnotify import Notifier
    from rlinkd.daemon.supervisor import Supervisor

    class FakeTopo:
        inboxes: ClassVar[dict] = {name: Inbox(name) for name in (*ROLES, "supervisor")}

    sup = Supervisor(load_config(overrides=[("daemon", "state_dir", str(tmp_path))]),
                     notifier=Notifier(""))
    sup.topo = FakeTopo()
    sup.core.start_all(time.monotonic())                     # as if every role were running
    yield sup
    for inbox in FakeTopo.inboxes.values():
        inbox.close()
    os.close(sup.wake_r)
    os.close(sup.wake_w)


def fill(inbox) -> int:
    n = 0
    while inbox.try_send(m.Stop("x" * 4000)):
        n += 1
    return n


def test_a_full_checkpointer_inbox_fails_the_request_at_once(shell):
    assert fill(shell.topo.inboxes["checkpointer"]) > 0
    t0 = time.monotonic()
    with capture_logs() as logs:
        shell._perform(shell.core.terminate(t0))
        shell.request_checkpoint("SIGUSR1")                  # ignored while stopping
    assert time.monotonic() - t0 < 1.0                        # no 5-second blocking send
    assert shell.core.final_ckpt_id is None and shell.undelivered_messages == 1
    assert events(logs, "checkpoint_failed")[0]["reason"] == "shutdown"
    assert "inbox full" in (shell.core.final_failure or "")  # the exit code will say so
    assert sent(shell.core.tick(t0 + 0.01, fresh()), m.Stop)


@pytest.mark.parametrize("ok", [True, False])
def test_the_final_checkpoints_outcome_reaches_the_core(shell, ok):
    with capture_logs():
        rid = final_request_id(shell.core.terminate(time.monotonic()))
        shell.on_checkpoint_done(m.CheckpointDone(rid, "shutdown", ok, "/c" if ok else "", 3,
                                                  "" if ok else "No space left on device"))
    assert shell.core.final_failure == (None if ok else "No space left on device")


def test_a_full_inbox_is_counted_and_logged_not_waited_on(shell):
    fill(shell.topo.inboxes["collector"])
    t0 = time.monotonic()
    with capture_logs() as logs:
        shell._perform([Send("collector", m.Drain("stop")), Send("learner", m.Stop("stop"))])
    assert time.monotonic() - t0 < 1.0
    assert shell.undelivered_messages == 1 and shell.info().undelivered_messages == 1
    [line] = events(logs, "message_undelivered")
    assert line["target"] == "collector" and line["kind"] == "Drain"
    assert shell.topo.inboxes["learner"].recv(1.0) == m.Stop("stop")


def test_the_loop_boundary_logs_the_traceback_and_exits_crash(shell, monkeypatch):
    def broken_loop():
        raise RuntimeError("a bug in the loop")
    monkeypatch.setattr(shell.core, "start_all", lambda now: [])
    monkeypatch.setattr(shell, "_loop", broken_loop)
    with capture_logs() as logs:
        assert shell._supervise() == ExitCode.CRASH
    [line] = events(logs, "supervisor_crashed")
    assert line["log_level"] == "error" and line.get("exc_info") is True


def test_signal_handlers_dispatch_through_the_core(shell):
    shell.sig_queue.extend([signal.SIGTERM, signal.SIGINT])
    shell._dispatch_signals()
    assert shell.stopping == "SIGTERM" and shell.exit_code == INTERRUPTED


def test_an_exit_nobody_asked_for_is_a_warning_even_while_stopping():
    core = make_core()
    core.start_all(0.0)
    with capture_logs() as logs:
        core.child_exited("connector", 1, 1.0)               # a crash while running
        core.terminate(2.0)                                  # draining, no Stop sent yet
        core.child_exited("learner", 0, 2.4)
        core.child_exited("collector", 0, 2.5)               # (Drain asked it to exit 0)
    assert [(e["child"], e["log_level"], e["requested"]) for e in events(logs, "child_exited")] == [
        ("connector", "warning", False), ("learner", "warning", False), ("collector", "info", True)]


# ---------------------------------------------------------------- a job's rank other than 0
def test_a_rank_other_than_0_writes_no_checkpoint_periodic_usr1_or_final():
    """config.writes_checkpoints: in a job only rank 0 writes; the others say so."""
    assert not writes_checkpoints(ClusterConfig(world_size=2, rank=1))
    assert writes_checkpoints(ClusterConfig(world_size=2)) and writes_checkpoints(ClusterConfig())
    core = SupervisorCore(DaemonConfig(shutdown_timeout_s=BUDGET_S), writes_checkpoints=False)
    core.start_all(0.0)
    with capture_logs() as logs:
        assert sent(core.request_checkpoint("SIGUSR1"), m.CheckpointRequest) == []
        assert sent(core.request_checkpoint("periodic"), m.CheckpointRequest) == []
        actions = core.terminate(100.0)
    assert [e["reason"] for e in events(logs, "checkpoint_not_written")] == ["SIGUSR1", "periodic",
                                                                            "shutdown"]
    assert sent(actions, m.CheckpointRequest) == [] and sent(actions, m.Drain)
    stop = core.tick(100.1, fresh())  # no final checkpoint to wait for: straight to Stop
    assert {target for target, _ in sent(stop, m.Stop)} == set(ROLES)
    for role in ROLES:
        core.child_exited(role, 0, 100.2)
    assert exits(core.tick(100.2, fresh())) == [0]  # no checkpoint was due: a complete drain


def test_a_signal_during_preparation_is_queued_and_the_handlers_restored(tmp_path, monkeypatch):
    """SIGTERM and SIGUSR1 while the supervisor prepares (a long replay refill) wait in the
    queue for the loop instead of killing the daemon before its cleanup (the default action)."""
    from rlinkd.daemon.errors import ConfigError
    from rlinkd.daemon.sdnotify import Notifier
    from rlinkd.daemon.supervisor import Supervisor
    sup = Supervisor(load_config(overrides=[("daemon", "state_dir", str(tmp_path))]), notifier=Notifier(""))
    before = signal.getsignal(signal.SIGTERM)

    def prepare() -> None:
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)
        raise ConfigError("stop the run here")
    monkeypatch.setattr(sup, "_prepare", prepare)
    with pytest.raises(ConfigError):
        sup.run()
    assert list(sup.sig_queue) == [signal.SIGUSR1, signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is before
