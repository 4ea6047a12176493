"""The supervisor (arbiter): starts the roles, keeps them alive, turns signals into actions.

Signal handlers only enqueue the signal number (``signal.set_wakeup_fd`` wakes the
loop); the main loop dispatches ``handle_<sig>()``. Each loop turn: wait on the
wake-up pipe, the supervisor inbox and the children's sentinels; dispatch signals;
handle messages; reap and restart children with exponential backoff; SIGABRT then
SIGKILL a child that stopped heart-beating; fire timers (periodic checkpoint,
status to the collector, systemd STATUS/WATCHDOG). A child exiting with a boot
error, or crash-looping, stops the daemon with a non-zero exit and one clear line.

Shutdown (SIGTERM/SIGINT): drain the collector (stop accepting, ERROR to clients),
let the learner finish the update in flight, write a final checkpoint, stop the
other roles, unlink shared memory, exit 0 — all within ``shutdown_timeout_s``.
A second SIGINT forces an immediate exit.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import select
import signal
import time
from pathlib import Path

import structlog

from rlinkd.daemon import messages as m
from rlinkd.daemon.checkpoint import store
from rlinkd.daemon.children import Child, hang_action, in_crash_loop, is_boot_error, schedule_restart
from rlinkd.daemon.config import (Config, ConfigError, apply_changes, load_config, reloadable_changes,
                           reloadable_values)
from rlinkd.daemon.errors import ExitCode
from rlinkd.daemon import log as logsetup
from rlinkd.daemon.roles import child_main
from rlinkd.daemon.runfiles import StateDirLock, remove_daemon_file, write_daemon_file
from rlinkd.daemon.metrics import TensorBoardMetrics
from rlinkd.daemon.sdnotify import Notifier, watchdog_interval_s
from rlinkd.daemon.wiring import ROLES, Topology, build_topology, destroy_topology

log = structlog.get_logger("supervisor")
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGCHLD)
LOOP_WAIT_S = 0.25
SYSTEMD_STATUS_EVERY_S = 2.0
INTERRUPTED = 130
START_ORDER = ("learner", "collector", "connector", "checkpointer")  # slowest boot first


class Supervisor:
    """One daemon instance. ``run()`` returns the process exit code."""

    def __init__(self, cfg: Config, overrides: list = (), fresh: bool = False,
                 notifier: Notifier | None = None) -> None:
        self.cfg, self.overrides, self.fresh = cfg, list(overrides), fresh
        self.notifier = notifier or Notifier()
        self.children = {role: Child(role) for role in ROLES}
        self.sig_queue: collections.deque[int] = collections.deque()
        self.topo: Topology | None = None
        self.stopping: str | None = None
        self.exit_code: int | None = None
        self.phase_deadline = 0.0
        self.final_ckpt_id: int | None = None
        self.ready_parts: set[str] = set()
        self.listening: m.Listening | None = None
        self.collector_status: m.CollectorStatus | None = None
        self.last_checkpoint: m.CheckpointInfo | None = None
        self.checkpoints_written = 0
        self.reload_generation = 0
        self.last_reload: m.ReloadResult | None = None
        self.route = m.Router("supervisor", {
            m.Listening: self._on_listening, m.LearnerReady: lambda _msg: self._mark_ready("learner"),
            m.CollectorStatus: self._on_collector_status, m.CheckpointDone: self._on_checkpoint_done})
        self.next_request_id = 1
        self.timers = {"checkpoint": 0.0, "info": 0.0, "systemd": 0.0, "watchdog": 0.0}
        self.watchdog_s = watchdog_interval_s()
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.metrics = TensorBoardMetrics(Path(cfg.state_dir) / "tensorboard")

    # ------------------------------------------------------------ lifecycle
    def run(self) -> int:
        state_dir = self.cfg.state_dir
        lock = StateDirLock(state_dir)
        try:
            self._prepare()
            self._install_signals()
            for role in START_ORDER:
                self._start(role)
            return self._loop()
        finally:
            self._cleanup()
            lock.release()

    def _prepare(self) -> None:
        root = store.checkpoints_dir(self.cfg.state_dir)
        for leftover in store.remove_staging(root):
            log.warning("removed_partial_checkpoint", path=str(leftover))
        resume = None if self.fresh else store.latest_valid(
            root, warn=lambda e: log.warning("skipping_bad_checkpoint", error=e))
        self.cfg.runtime_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.topo = build_topology(self.cfg)
        if resume is not None:
            self.topo.resume_checkpoint = str(resume.path)
            self.topo.write_counters(resume.counters)
            self.last_checkpoint = m.CheckpointInfo(str(resume.path), resume.weights_seq_no,
                                                    resume.manifest.get("created_at", time.time()))
            log.info("resuming", checkpoint=str(resume.path), weights_seq_no=resume.weights_seq_no)
        self.timers["checkpoint"] = time.monotonic() + self.cfg.checkpoint.checkpoint_interval_s

    def _install_signals(self) -> None:
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        for sig in HANDLED_SIGNALS:
            signal.signal(sig, self._enqueue_signal)

    def _enqueue_signal(self, signum, _frame) -> None:
        self.sig_queue.append(signum)  # nothing else: no logging, no raising

    def _start(self, role: str) -> None:
        child = self.children[role]
        child.start(child_main, (role, self.topo))
        self.topo.heartbeats[ROLES.index(role)] = time.monotonic()
        log.info("child_started", child=role, child_pid=child.pid, restarts=child.restarts)

    def _cleanup(self) -> None:
        signal.set_wakeup_fd(-1)
        for child in self.children.values():
            child.signal(signal.SIGKILL)
            if child.process is not None and child.process.pid is not None:
                child.process.join(2.0)
        if self.topo is not None:
            destroy_topology(self.topo)
        Path(self.cfg.socket_path).unlink(missing_ok=True)
        remove_daemon_file(self.cfg.state_dir)
        self.metrics.close()
        self.notifier.close()
        os.close(self.wake_r)
        os.close(self.wake_w)

    # ------------------------------------------------------------ main loop
    def _loop(self) -> int:
        while self.exit_code is None:
            self._wait()
            self._dispatch_signals()
            for msg in self.topo.inboxes["supervisor"].drain():
                self.route(msg)
            self._reap()
            if self.stopping:
                self._advance_shutdown()
            else:
                self._restart_due()
                self._check_heartbeats()
                self._timers()
        return self.exit_code

    def _wait(self) -> None:
        fds = [self.wake_r, self.topo.inboxes["supervisor"].fileno()]
        fds += [s for c in self.children.values() if (s := c.sentinel()) is not None]
        ready, _, _ = select.select(fds, [], [], LOOP_WAIT_S)
        if self.wake_r in ready:
            try:
                os.read(self.wake_r, 4096)
            except BlockingIOError:
                pass

    def _dispatch_signals(self) -> None:
        while self.sig_queue:
            name = signal.Signals(self.sig_queue.popleft()).name.lower()[3:]
            getattr(self, f"handle_{name}")()

    # ------------------------------------------------------------ signal handlers
    def handle_term(self) -> None:
        self.begin_shutdown("SIGTERM", ExitCode.OK)

    def handle_int(self) -> None:
        if self.stopping:
            log.warning("forced_exit", reason="second SIGINT")
            self.exit_code = INTERRUPTED
            return
        self.begin_shutdown("SIGINT", ExitCode.OK)

    def handle_usr1(self) -> None:
        if not self.stopping:
            self.request_checkpoint("SIGUSR1")

    def handle_hup(self) -> None:
        if not self.stopping:
            self.reload()

    def handle_chld(self) -> None:
        """Children are reaped every loop turn; SIGCHLD only wakes the loop."""

    # ------------------------------------------------------------ messages
    def _on_listening(self, msg: m.Listening) -> None:
        self.listening = msg
        self._pin_port(msg.port)
        self.topo.inboxes["collector"].try_send(self.info())  # status complete at once
        self._mark_ready("listening")

    def _on_collector_status(self, msg: m.CollectorStatus) -> None:
        self.collector_status = msg
        self.metrics.record(msg)

    def _pin_port(self, port: int) -> None:
        """With ``port = 0`` the first collector picked a port; a restarted one must reuse
        it, or reconnecting clients would knock on a closed door."""
        if self.cfg.server.port == 0:
            self.cfg = dataclasses.replace(self.cfg, server=dataclasses.replace(
                self.cfg.server, port=port))
            self.topo = dataclasses.replace(self.topo, cfg=self.cfg)

    def _mark_ready(self, part: str) -> None:
        if part in self.ready_parts and part != "listening":
            return
        self.ready_parts.add(part)
        if {"listening", "learner"} <= self.ready_parts and self.listening is not None:
            self._write_daemon_file()
            if "announced" not in self.ready_parts:
                self.ready_parts.add("announced")
                self.notifier.ready(f"listening on {self.listening.host}:{self.listening.port}")
                log.info("ready", host=self.listening.host, port=self.listening.port,
                         unix_socket=self.listening.unix_socket)

    def _write_daemon_file(self) -> None:
        write_daemon_file(self.cfg.state_dir, {
            "pid": os.getpid(), "unix_socket": self.listening.unix_socket,
            "host": self.listening.host, "port": self.listening.port,
            "state_dir": str(self.cfg.state_dir), "runtime_dir": str(self.cfg.runtime_dir),
            "shm_dir": self.cfg.daemon.shm_dir, "started_at": self.topo.started_at})

    # ------------------------------------------------------------ checkpoints
    def request_checkpoint(self, reason: str) -> int:
        rid, self.next_request_id = self.next_request_id, self.next_request_id + 1
        self.topo.inboxes["checkpointer"].send(m.CheckpointRequest(rid, reason))
        log.info("checkpoint_requested", reason=reason, request_id=rid)
        return rid

    def _on_checkpoint_done(self, msg: m.CheckpointDone) -> None:
        if msg.ok:
            self.checkpoints_written += 1
            self.last_checkpoint = m.CheckpointInfo(msg.path, msg.seq_no, time.time())
            self.topo.resume_checkpoint = msg.path
            log.info("checkpoint_done", path=msg.path, reason=msg.reason, weights_seq_no=msg.seq_no)
        else:
            log.error("checkpoint_failed", reason=msg.reason, error=msg.error)
        if msg.request_id == self.final_ckpt_id:
            self.final_ckpt_id = None

    # ------------------------------------------------------------ reload
    def reload(self) -> None:
        """Re-read the config file; apply reloadable keys everywhere or change nothing."""
        self.notifier.reloading()
        self.reload_generation += 1
        try:
            new = load_config(self.cfg.source_file or None, self.overrides)
            new = dataclasses.replace(new, daemon=dataclasses.replace(
                new.daemon, state_dir=self.cfg.daemon.state_dir,
                runtime_dir=self.cfg.daemon.runtime_dir))
        except ConfigError as exc:
            log.error("reload_rejected", error=str(exc))
            self.last_reload = m.ReloadResult(self.reload_generation, False, time.time(), {}, (),
                                              str(exc))
            self.notifier.ready("reload rejected")
            return
        applied, ignored = reloadable_changes(self.cfg, new)
        self._apply(applied)
        log.info("reloaded", applied=applied, needs_restart=ignored)
        self.last_reload = m.ReloadResult(self.reload_generation, True, time.time(), applied,
                                          tuple(ignored), "")
        self.notifier.ready("reloaded")

    def _apply(self, changes: dict) -> None:
        self.cfg = apply_changes(self.cfg, changes)
        self.topo = dataclasses.replace(self.topo, cfg=self.cfg)
        logsetup.reload_level(changes, "supervisor")
        if "checkpoint.checkpoint_interval_s" in changes:
            self.timers["checkpoint"] = time.monotonic() + self.cfg.checkpoint.checkpoint_interval_s
        for role in ROLES:
            self.topo.inboxes[role].try_send(m.Reload(changes))

    # ------------------------------------------------------------ children
    def _reap(self) -> None:
        now = time.monotonic()
        for role, child in self.children.items():
            code = child.reap()
            if code is None:
                continue
            log.warning("child_exited", child=role, exit_code=code, stopping=bool(self.stopping))
            if self.stopping:
                continue
            if is_boot_error(code):
                log.error("boot_error_stopping", child=role, exit_code=code)
                self.begin_shutdown(f"{role} failed to start", ExitCode.BOOT_ERROR)
            else:
                self._plan_restart(child, now)

    def _plan_restart(self, child: Child, now: float) -> None:
        d = self.cfg.daemon
        delay = schedule_restart(child, now, d.restart_backoff_s, d.restart_backoff_max_s)
        if in_crash_loop(child, now, d.crash_loop_restarts, d.crash_loop_window_s):
            log.error("crash_loop", child=child.role, restarts=len(child.crash_times),
                      window_s=d.crash_loop_window_s,
                      message=f"{child.role} crashed more than {d.crash_loop_restarts} times "
                              f"within {d.crash_loop_window_s:g} s; stopping the daemon")
            self.begin_shutdown(f"{child.role} is crash-looping", ExitCode.CRASH_LOOP)
            return
        log.info("restart_scheduled", child=child.role, delay_s=round(delay, 2))

    def _restart_due(self) -> None:
        now = time.monotonic()
        for role, child in self.children.items():
            if child.process is None and child.restart_at is not None and now >= child.restart_at:
                child.restarts += 1
                self._start(role)

    def _check_heartbeats(self) -> None:
        now = time.monotonic()
        for role, child in self.children.items():
            age = now - self.topo.last_heartbeat(role)
            sig = hang_action(child, age, self.cfg.daemon.heartbeat_timeout_s, now)
            if sig is not None:
                log.error("child_hung", child=role, heartbeat_age_s=round(age, 1),
                          signal=signal.Signals(sig).name)
                child.signal(sig)

    # ------------------------------------------------------------ timers
    def _timers(self) -> None:
        now = time.monotonic()
        interval = self.cfg.checkpoint.checkpoint_interval_s
        if interval > 0 and now >= self.timers["checkpoint"]:
            self.timers["checkpoint"] = now + interval
            self.request_checkpoint("periodic")
        if now >= self.timers["info"]:
            self.timers["info"] = now + self.cfg.daemon.status_interval_s
            self.topo.inboxes["collector"].try_send(self.info())
        if now >= self.timers["systemd"]:
            self.timers["systemd"] = now + SYSTEMD_STATUS_EVERY_S
            self.notifier.status(self._status_line())
        if self.watchdog_s and now >= self.timers["watchdog"]:
            self.timers["watchdog"] = now + self.watchdog_s
            self.notifier.watchdog()

    def info(self) -> m.DaemonInfo:
        """The supervisor's part of ``rlinkd status``."""
        children = {role: m.ChildInfo(c.pid, c.restarts, c.alive(), c.last_exit)
                    for role, c in self.children.items()}
        return m.DaemonInfo(
            daemon_pid=os.getpid(), state="stopping" if self.stopping else "running",
            children=children, last_checkpoint=self.last_checkpoint,
            checkpoints_written=self.checkpoints_written,
            reload_generation=self.reload_generation, last_reload=self.last_reload,
            state_dir=str(self.cfg.state_dir), config=reloadable_values(self.cfg))

    def _status_line(self) -> str:
        s = self.collector_status
        if s is None:
            return "starting"
        ret = "-" if s.episode_return_mean is None else f"{s.episode_return_mean:.1f}"
        return (f"{s.env_steps_per_s:.0f} steps/s, mean return {ret}, seq_no {s.weights_seq_no}, "
                f"{s.clients} clients")

    # ------------------------------------------------------------ shutdown
    def begin_shutdown(self, reason: str, code: int) -> None:
        """Start the graceful stop: drain clients, then a final checkpoint, then stop roles."""
        if self.stopping:
            return
        self.stopping, self.pending_exit = reason, int(code)
        self.notifier.stopping()
        log.info("stopping", reason=reason)
        budget = self.cfg.daemon.shutdown_timeout_s
        self.shutdown_deadline = time.monotonic() + budget
        self.phase_deadline = time.monotonic() + budget * 0.7
        self.topo.inboxes["collector"].try_send(m.Drain(reason))
        if self.children["learner"].alive() and self.children["checkpointer"].alive():
            self.final_ckpt_id = self.request_checkpoint("shutdown")
        self.phase = "checkpoint"

    def _advance_shutdown(self) -> None:
        now = time.monotonic()
        if self.phase == "checkpoint":
            writers_alive = self.children["learner"].alive() and self.children["checkpointer"].alive()
            if self.final_ckpt_id is None or now >= self.phase_deadline or not writers_alive:
                if self.final_ckpt_id is not None:
                    log.error("final_checkpoint_not_written", timed_out=now >= self.phase_deadline,
                              writers_alive=writers_alive)
                for role in ROLES:
                    self.topo.inboxes[role].try_send(m.Stop(self.stopping))
                self.phase = "stop"
        elif self.phase == "stop":
            alive = [c for c in self.children.values() if c.alive()]
            if not alive:
                log.info("stopped", exit_code=self.pending_exit)
                self.exit_code = self.pending_exit
            elif now >= self.shutdown_deadline:
                for child in alive:
                    log.error("child_killed_at_deadline", child=child.role)
                    child.signal(signal.SIGKILL)
                self.exit_code = self.pending_exit
