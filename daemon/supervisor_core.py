"""The supervisor's decisions, without processes, sockets or signals.

``SupervisorCore`` is fed events (a signal arrived, a child exited, a checkpoint
finished, time passed) with the current monotonic time and answers with actions
(``Start``, ``Kill``, ``Send``, ``ShutdownBegun``, ``Exit``) that the process shell,
``daemon.supervisor.Supervisor``, carries out. It owns:

- the restart policy: exponential backoff (reset after a healthy minute), the
  crash-loop rule, boot errors stopping the restart loop, and hang escalation
  (SIGABRT, then SIGKILL after a grace, then an ordinary restart);
- the shutdown state machine: drain the collector and ask for a final checkpoint
  (``CHECKPOINT``), send Stop to every role once that checkpoint is written, timed
  out (70 % of ``shutdown_timeout_s``) or cannot be written (``STOP``), exit once
  every child is gone or SIGKILL the rest at the deadline (``DONE``). A second
  SIGINT exits at once with 130;
- the exit code of a stop (``drain_exit_code``): 0 only for a complete drain, else
  one code saying the final checkpoint was not written, or roles were killed.
"""
from __future__ import annotations

import dataclasses
import enum
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from rlinkd.daemon import messages as m
from rlinkd.daemon.children import (RoleState, hang_action, in_crash_loop, is_boot_error,
                                    schedule_restart)
from rlinkd.daemon.config import Config, DaemonConfig
from rlinkd.daemon.errors import ExitCode
from rlinkd.daemon.roster import START_ORDER

log = structlog.get_logger("supervisor")
INTERRUPTED = 130                # exit code of a forced exit (second SIGINT), as for Ctrl-C
FINAL_CHECKPOINT_SHARE = 0.7     # of shutdown_timeout_s, for the final checkpoint
WRITERS = ("learner", "checkpointer")  # both must run for a checkpoint to be written


# ---------------------------------------------------------------- actions
@dataclass(frozen=True)
class Start:
    """Spawn this role's process (first start or restart)."""

    role: str


@dataclass(frozen=True)
class Kill:
    """Send ``sig`` to this role's process (hang escalation, shutdown deadline)."""

    role: str
    sig: int


@dataclass(frozen=True)
class Send:
    """Deliver ``msg`` to ``target``'s inbox without waiting (the shell reports failure
    back: ``checkpoint_finished`` for an undeliverable ``CheckpointRequest``)."""

    target: str
    msg: Any


@dataclass(frozen=True)
class ShutdownBegun:
    """The graceful stop started (the shell tells systemd STOPPING=1)."""

    reason: str


@dataclass(frozen=True)
class Exit:
    """The supervisor loop ends with this exit code (children are then killed, segments
    unlinked by the shell's cleanup)."""

    code: int


Action = Start | Kill | Send | ShutdownBegun | Exit


class Phase(enum.Enum):
    RUNNING = "running"
    CHECKPOINT = "checkpoint"  # draining, final checkpoint in flight
    STOP = "stop"              # Stop sent to every role, waiting for them to exit
    DONE = "done"              # Exit decided: no more actions


class SupervisorCore:
    """Restart policy and shutdown state machine of one daemon. Not thread-safe; every
    method is called from the supervisor loop, returns the actions to carry out now."""

    def __init__(self, settings: DaemonConfig, roles: tuple[str, ...] = START_ORDER,
                 writes_checkpoints: bool = True) -> None:
        self.settings = settings
        self.writes_checkpoints = writes_checkpoints  # False: a job's rank other than 0
        self.roles = {role: RoleState(role) for role in roles}
        self.phase = Phase.RUNNING
        self.stopping: str | None = None
        self.pending_exit = int(ExitCode.OK)
        self.checkpoint_deadline = self.shutdown_deadline = 0.0
        self.final_ckpt_id: int | None = None   # the final checkpoint, while waited for
        self.final_rid: int | None = None       # the final checkpoint's request, once asked
        self.final_failure: str | None = None   # why it was not written (None: written or not due)
        self.killed: list[str] = []             # roles SIGKILLed at the shutdown deadline
        self.next_request_id = 1

    # ------------------------------------------------------------ starting
    def start_all(self, now: float) -> list[Action]:
        """Called once after the topology exists: start every role in start order."""
        for state in self.roles.values():
            state.mark_started(now)
        return [Start(role) for role in self.roles]

    # ------------------------------------------------------------ signals
    def terminate(self, now: float) -> list[Action]:
        """SIGTERM: the graceful stop (exit 0 when the drain completes, ``drain_exit_code``)."""
        return self.begin_shutdown("SIGTERM", ExitCode.OK, now)

    def interrupt(self, now: float) -> list[Action]:
        """SIGINT: the graceful stop; a second one while stopping exits at once (130)."""
        if self.phase is Phase.DONE:
            return []
        if self.stopping:
            log.warning("forced_exit", reason="second SIGINT")
            return self._exit(INTERRUPTED)
        return self.begin_shutdown("SIGINT", ExitCode.OK, now)

    # ------------------------------------------------------------ checkpoints
    def request_checkpoint(self, reason: str) -> list[Action]:
        """Ask the checkpointer for a checkpoint (timer, SIGUSR1); none once stopping
        (the shutdown asks for its own final one)."""
        if self.phase is not Phase.RUNNING:
            return []
        if not self.writes_checkpoints:
            log.info("checkpoint_not_written", reason=reason,
                     why="rank 0 writes the job's checkpoints")
            return []
        return self._checkpoint(reason)[1]

    def _checkpoint(self, reason: str) -> tuple[int, list[Action]]:
        rid, self.next_request_id = self.next_request_id, self.next_request_id + 1
        log.info("checkpoint_requested", reason=reason, request_id=rid)
        return rid, [Send("checkpointer", m.CheckpointRequest(rid, reason))]

    def checkpoint_finished(self, request_id: int, failure: str | None) -> None:
        """A request ended, written (``failure`` None) or failed (CheckpointDone, or it
        could not be delivered): the shutdown no longer waits for it. The final one's
        outcome decides the exit code, even when it comes after its deadline."""
        if request_id == self.final_rid:
            self.final_ckpt_id, self.final_failure = None, failure

    # ------------------------------------------------------------ children
    def child_exited(self, role: str, code: int, now: float) -> list[Action]:
        """The shell reaped ``role`` with ``code``: restart it later, or stop the daemon
        (boot error, crash loop). While stopping, exits are expected and final. Logged at info
        level when the role exits 0 after being sent Stop, or Drain for the collector
        (``requested``), else at warning."""
        state = self.roles[role]
        state.mark_exited(code)
        drained = role == "collector" and self.stopping is not None  # (Drain asks it to exit)
        requested = code == ExitCode.OK and (drained or self.phase in (Phase.STOP, Phase.DONE))
        level = log.info if requested else log.warning
        level("child_exited", child=role, exit_code=code, stopping=bool(self.stopping), requested=requested)
        if self.stopping:
            return []
        if is_boot_error(code):
            log.error("boot_error_stopping", child=role, exit_code=code)
            reason = ExitCode.CONFIG if code == ExitCode.CONFIG else ExitCode.BOOT_ERROR
            return self.begin_shutdown(f"{role} failed to start", reason, now)
        return self._plan_restart(state, now)

    def _plan_restart(self, state: RoleState, now: float) -> list[Action]:
        s = self.settings
        delay = schedule_restart(state, now, s.restart_backoff_s, s.restart_backoff_max_s)
        if in_crash_loop(state, now, s.crash_loop_restarts, s.crash_loop_window_s):
            log.error("crash_loop", child=state.role, restarts=len(state.crash_times),
                      window_s=s.crash_loop_window_s,
                      message=f"{state.role} crashed more than {s.crash_loop_restarts} times "
                              f"within {s.crash_loop_window_s:g} s; stopping the daemon")
            return self.begin_shutdown(f"{state.role} is crash-looping", ExitCode.CRASH_LOOP, now)
        log.info("restart_scheduled", child=state.role, delay_s=round(delay, 2))
        return []

    # ------------------------------------------------------------ time
    def tick(self, now: float, heartbeat_ages: Mapping[str, float]) -> list[Action]:
        """Every loop turn: due restarts and hang escalation while running; the next
        shutdown step while stopping. ``heartbeat_ages`` holds seconds per role."""
        if self.phase is Phase.RUNNING:
            return self._restarts_due(now) + self._hangs(now, heartbeat_ages)
        if self.phase is Phase.CHECKPOINT:
            return self._after_final_checkpoint(now)
        if self.phase is Phase.STOP:
            return self._after_stop(now)
        return []

    def _restarts_due(self, now: float) -> list[Action]:
        actions: list[Action] = []
        for role, state in self.roles.items():
            if not state.running and state.restart_at is not None and now >= state.restart_at:
                state.restarts += 1
                state.mark_started(now)
                actions.append(Start(role))
        return actions

    def _hangs(self, now: float, heartbeat_ages: Mapping[str, float]) -> list[Action]:
        actions: list[Action] = []
        for role, state in self.roles.items():  # a process is never silent longer than it lived
            age = min(heartbeat_ages.get(role, 0.0), now - state.started_at)
            sig = hang_action(state, age, self.settings.heartbeat_timeout_s, now)
            if sig is not None:
                log.error("child_hung", child=role, heartbeat_age_s=round(age, 1),
                          signal=signal.Signals(sig).name)
                actions.append(Kill(role, sig))
        return actions

    # ------------------------------------------------------------ shutdown
    def begin_shutdown(self, reason: str, code: int, now: float) -> list[Action]:
        """Start the graceful stop (idempotent: the first reason and code win)."""
        if self.stopping:
            return []
        self.stopping, self.pending_exit = reason, int(code)
        log.info("stopping", reason=reason)
        budget = self.settings.shutdown_timeout_s
        self.shutdown_deadline = now + budget
        self.checkpoint_deadline = now + budget * FINAL_CHECKPOINT_SHARE
        actions: list[Action] = [ShutdownBegun(reason), Send("collector", m.Drain(reason))]
        self.phase = Phase.CHECKPOINT
        if not self.writes_checkpoints:
            log.info("checkpoint_not_written", reason="shutdown",
                     why="rank 0 writes the job's checkpoints")
        elif self._writers_running():
            self.final_ckpt_id, request = self._checkpoint("shutdown")
            self.final_rid, self.final_failure = self.final_ckpt_id, "not answered"
            actions += request
        else:
            self.final_failure = "the learner or the checkpointer was not running"
        return actions

    def _writers_running(self) -> bool:
        return all(self.roles[role].running for role in WRITERS if role in self.roles)

    def _after_final_checkpoint(self, now: float) -> list[Action]:
        writers, timed_out = self._writers_running(), now >= self.checkpoint_deadline
        if self.final_ckpt_id is not None and writers and not timed_out:
            return []
        if self.final_ckpt_id is not None:
            log.warning("final_checkpoint_not_written", timed_out=timed_out, writers_alive=writers)
            self.final_ckpt_id = None
            share_s = self.settings.shutdown_timeout_s * FINAL_CHECKPOINT_SHARE
            self.final_failure = (f"not written within {share_s:g} s" if timed_out else
                                  "the learner or the checkpointer exited before writing it")
        self.phase = Phase.STOP
        reason = self.stopping
        assert reason is not None, "the stop phases only follow begin_shutdown()"
        return [Send(role, m.Stop(reason)) for role in self.roles]

    def _after_stop(self, now: float) -> list[Action]:
        running = [role for role, state in self.roles.items() if state.running]
        if running and now < self.shutdown_deadline:
            return []
        for role in running:
            log.error("child_killed_at_deadline", child=role)
        self.killed = running
        return [Kill(role, signal.SIGKILL) for role in running] + self._stopped()

    def _stopped(self) -> list[Action]:
        """The end of a graceful stop: its exit code, logged (at error level, with the
        reason, when the drain was incomplete)."""
        code = drain_exit_code(self.pending_exit, self.final_failure, self.killed)
        if self.final_failure is None and not self.killed:
            log.info("stopped", exit_code=code)
        else:
            lost = self.final_failure is not None
            log.error("drain_incomplete", exit_code=code, final_checkpoint=self.final_failure or (
                          "written" if self.writes_checkpoints else "not due"),
                      killed=self.killed, message="stopped, but the final checkpoint was not written"
                      if lost else "stopped, but roles had to be killed at the deadline")
        return self._exit(code)

    def _exit(self, code: int) -> list[Action]:
        self.phase = Phase.DONE
        return [Exit(int(code))]


def drain_exit_code(pending: int, final_failure: str | None, killed: list[str]) -> int:
    """The exit code of a graceful stop begun with ``pending`` (0 for SIGTERM/SIGINT): a
    stop begun for another reason (boot error, crash loop) keeps its code; else a final
    checkpoint not written (``final_failure``: why) is ``DRAIN_NO_CHECKPOINT``, roles
    SIGKILLed at the deadline ``DRAIN_KILLED``, and only a complete drain 0."""
    if pending != ExitCode.OK:
        return int(pending)
    if final_failure is not None:
        return int(ExitCode.DRAIN_NO_CHECKPOINT)
    return int(ExitCode.DRAIN_KILLED if killed else ExitCode.OK)


# ---------------------------------------------------------------- reload
def reload_target(current: Config, loaded: Config, picked_port: int | None) -> Config:
    """The config a SIGHUP reload compares with ``current`` (the one in force).

    Called by the shell once per SIGHUP with the freshly ``loaded`` file. The state
    and runtime directories are fixed at start (the state-dir lock, the socket and the
    pid file live there), so they are carried over. When the daemon started with
    ``server.port = 0`` the collector picked ``picked_port`` and the supervisor pinned
    it: a file still saying 0 means that same port, not a change needing a restart.
    """
    daemon = dataclasses.replace(loaded.daemon, state_dir=current.daemon.state_dir,
                                 runtime_dir=current.daemon.runtime_dir)
    server = loaded.server
    if picked_port is not None and server.port == 0:
        server = dataclasses.replace(server, port=picked_port)
    return dataclasses.replace(loaded, daemon=daemon, server=server)
