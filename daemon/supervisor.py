"""The supervisor's process shell: processes, signals, inboxes and timers around a pure core.

Every decision (restart when, crash loop, hung child, each shutdown step, exit code)
is made by ``daemon.supervisor_core.SupervisorCore`` from events and the current
time; this shell feeds it events and carries out the actions it returns.

Signal handlers only enqueue the signal number (``signal.set_wakeup_fd`` wakes the
loop); the loop dispatches ``handle_<sig>()``. Each loop turn: wait on the wake-up
pipe, the supervisor inbox and the children's sentinels; dispatch signals; handle
messages (a handler table keyed by message class); reap children; let the core act
on the time; fire timers (periodic checkpoint, status to the collector, systemd
STATUS/WATCHDOG). The loop never blocks on a full inbox: every send is non-blocking,
and one that cannot be delivered is logged and counted (an undeliverable checkpoint
request fails at once). Anything escaping the loop is logged with its traceback and
ends the daemon with ``CRASH``; the cleanup still kills the children and unlinks the
shared memory.

Shutdown (SIGTERM/SIGINT): drain the collector (stop accepting, ERROR to clients),
let the learner finish the update in flight, write a final checkpoint, stop the
other roles, unlink shared memory, exit 0 — all within ``shutdown_timeout_s``; a
final checkpoint not written exits 74, roles killed at the deadline 70 (the core's
``drain_exit_code``). A second SIGINT forces an immediate exit.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import select
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from rlinkd.daemon import log as logsetup
from rlinkd.client_lib.protocol.agents import DEFAULT_POLICY
from rlinkd.daemon import messages as m
from rlinkd.daemon import supervisor_core as core
from rlinkd.daemon.checkpoint import store
from rlinkd.daemon.children import Child
from rlinkd.daemon.config import (Config, ConfigError, apply_changes, load_config,
                                  reloadable_changes, reloadable_values, writes_checkpoints)
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.daemon.errors import CheckpointError, ExitCode
from rlinkd.daemon.export import POLICY_FILE, checkpoint_policies, describe_checkpoint
from rlinkd.daemon.frozen import check_frozen
from rlinkd.daemon.metrics import TensorBoardMetrics
from rlinkd.daemon.roles import child_main
from rlinkd.daemon.roster import ROLES, START_ORDER
from rlinkd.daemon.runfiles import StateDirLock, remove_daemon_file, write_daemon_file
from rlinkd.daemon.sdnotify import Notifier, watchdog_interval_s
from rlinkd.daemon.wiring import Topology, build_topology, destroy_topology, reconfigured

if TYPE_CHECKING:
    from rlinkd.daemon.prom_server import MetricsEndpoint

log = structlog.get_logger("supervisor")
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGCHLD)
LOOP_WAIT_S = 0.25
SYSTEMD_STATUS_EVERY_S = 2.0
INTERRUPTED = core.INTERRUPTED


def check_resume_matches(resume: store.Checkpoint, spec: PolicySpec,
                         policy: str = DEFAULT_POLICY) -> None:
    """ConfigError (exit 78) when the checkpoint to resume was trained for other spaces or
    another network than the config describes for ``policy``: never load it silently into
    a network it does not fit. ``--fresh`` starts without it. A policy the checkpoint does
    not hold (added to the config since) starts fresh; only the default must be there."""
    if policy != DEFAULT_POLICY:
        if store.policy_file(policy, POLICY_FILE) in resume.manifest.get("files", {}):
            _check_same_network(resume, spec, policy)
        return
    if POLICY_FILE not in resume.manifest.get("files", {}):
        raise ConfigError(f"checkpoint {resume.path} was written by an rlinkd older than composite "
                          f"spaces (it has no {POLICY_FILE}; its learner state cannot be loaded): "
                          f"start with --fresh to ignore checkpoints")
    _check_same_network(resume, spec, policy)


def _check_same_network(resume: store.Checkpoint, spec: PolicySpec, policy: str) -> None:
    try:
        _, _, saved = describe_checkpoint(resume, policy)
    except CheckpointError as exc:
        raise ConfigError(f"cannot resume from {resume.path}: {exc} (start with --fresh to "
                          f"ignore checkpoints)") from None
    if saved.to_json() != spec.to_json():
        changed = sorted(k for k, v in spec.to_json().items() if saved.to_json().get(k) != v)
        raise ConfigError(f"checkpoint {resume.path} was trained for different spaces or "
                          f"network for policy {policy!r} ({', '.join(changed)} differ from this "
                          f"config): restore the config, or start with --fresh to ignore "
                          f"checkpoints")


def _metrics_endpoint(cfg: Config) -> MetricsEndpoint | None:
    """The Prometheus endpoint when ``metrics.listen`` asks for one (off by default: the
    HTTP server and prometheus_client are then never imported, ~60 ms of every start)."""
    if not cfg.metrics.listen:
        return None
    from rlinkd.daemon.prom_server import MetricsEndpoint
    return MetricsEndpoint(cfg)


class Supervisor:
    """One daemon instance. ``run()`` returns the process exit code."""

    def __init__(self, cfg: Config, overrides: Sequence[tuple[str, str, object]] = (), fresh: bool = False,
                 notifier: Notifier | None = None) -> None:
        self.cfg, self.overrides, self.fresh = cfg, list(overrides), fresh
        self.notifier = notifier or Notifier()
        self.core = core.SupervisorCore(cfg.daemon, START_ORDER, writes_checkpoints(cfg.cluster))
        self.children = {role: Child(role) for role in START_ORDER}
        self.sig_queue: collections.deque[int] = collections.deque()
        self.previous_handlers: dict[int, Any] = {}
        self._topo: Topology | None = None
        self.exit_code: int | None = None
        self.ready_parts: set[str] = set()
        self.listening: m.Listening | None = None
        self.picked_port: int | None = None  # the collector's pick when server.port = 0
        self.collector_status: m.CollectorStatus | None = None
        self.last_checkpoint: m.CheckpointInfo | None = None
        self.checkpoints_written = 0
        self.checkpoints_failed = 0
        self.last_checkpoint_failure: m.CheckpointFailure | None = None
        self.signal_checkpoint_request = 0
        self.undelivered_messages = 0
        self.reload_generation = 0
        self.last_reload: m.ReloadResult | None = None
        self.timers = {"checkpoint": 0.0, "info": 0.0, "systemd": 0.0, "watchdog": 0.0}
        self.watchdog_s = watchdog_interval_s()
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.metrics = TensorBoardMetrics(Path(cfg.state_dir) / "tensorboard")
        self.endpoint = _metrics_endpoint(cfg)
        self.route = m.Router("supervisor", {
            m.Listening: self.on_listening, m.LearnerReady: self.on_learner_ready,
            m.CollectorStatus: self.on_collector_status, m.CheckpointDone: self.on_checkpoint_done})
        self.performers: dict[type, Callable[[Any], None]] = {
            core.Start: self._do_start, core.Kill: self._do_kill, core.Send: self._do_send,
            core.ShutdownBegun: self._do_shutdown_begun, core.Exit: self._do_exit}

    @property
    def stopping(self) -> str | None:
        return self.core.stopping

    @property
    def topo(self) -> Topology:
        """The shared topology, built by ``_prepare()`` before anything else uses it."""
        if self._topo is None:
            raise RuntimeError("the supervisor's topology is used before _prepare() built it")
        return self._topo

    @topo.setter
    def topo(self, topo: Topology) -> None:
        self._topo = topo

    # ------------------------------------------------------------ lifecycle
    def run(self) -> int:
        """Prepare (a ``ConfigError`` here reaches the CLI: one line, exit 78), then
        supervise until the core decides the exit code; always clean up. The handlers come
        first: a signal during a long preparation (a replay buffer refilled from a checkpoint)
        waits in the queue for the first turn of the loop instead of killing the daemon
        before its cleanup."""
        lock = StateDirLock(self.cfg.state_dir)
        try:
            self._install_signals()
            self._prepare()
            return self._supervise()
        finally:
            self._cleanup()
            lock.release()

    def _supervise(self) -> int:
        """The loop boundary: an unexpected exception is logged with its traceback and
        ends the daemon with CRASH (``run`` then kills the children, unlinks segments)."""
        try:
            self._perform(self.core.start_all(time.monotonic()))
            return self._loop()
        except Exception:  # the supervisor's process boundary
            log.exception("supervisor_crashed")
            return int(ExitCode.CRASH)

    def _checkpoint_to_resume(self, root: Path) -> store.Checkpoint | None:
        """The newest valid checkpoint under ``root``; None on a fresh start, and for a rank
        of a job other than 0: its checkpoints, if any, are of another run (a job's are rank
        0's), and it takes the job's state when the group forms."""
        if self.fresh:
            return None
        if not writes_checkpoints(self.cfg.cluster):
            if store.list_checkpoints(root):
                log.info("checkpoints_not_resumed", rank=self.cfg.cluster.rank,
                         reason="a rank other than 0 takes the job's state when the group forms")
            return None
        return store.latest_valid(root, warn=lambda e: log.warning("skipping_bad_checkpoint", error=e))

    def _prepare(self) -> None:
        root = store.checkpoints_dir(self.cfg.state_dir)
        for leftover in store.remove_staging(root):
            log.warning("removed_partial_checkpoint", path=str(leftover))
        if self.fresh and (aside := store.set_aside(root)) is not None:
            log.info("checkpoints_set_aside", path=str(aside))  # (a later plain start resumes this run)
        resume = self._checkpoint_to_resume(root)
        self.cfg.runtime_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.topo = build_topology(self.cfg)
        for policy in self.topo.policies.values():
            if not policy.trainable:
                check_frozen(policy.definition)
        if resume is not None:
            self._resume_from(resume)
        self.timers["checkpoint"] = time.monotonic() + self.cfg.checkpoint.checkpoint_interval_s
        if self.endpoint is not None:
            self.endpoint.start()
            self.endpoint.publish(self.info())

    def _resume_from(self, resume: store.Checkpoint) -> None:
        """Check the checkpoint fits the config (ConfigError, exit 78), then hand it to the
        roles: its path, counters and replay buffers. A policy it holds that the config no
        longer trains is named in a warning (its state stays in that checkpoint only)."""
        trainable = self.topo.trainable()
        for policy in trainable:
            check_resume_matches(resume, policy.spec, policy.name)
        if dropped := sorted(set(checkpoint_policies(resume)) - {p.name for p in trainable}):
            log.warning("checkpoint_policies_not_resumed", policies=dropped, checkpoint=str(resume.path),
                        why="not trainable policies of this config: their state stays in this "
                            "checkpoint only, until it is pruned")
        self.topo.resume_checkpoint = str(resume.path)
        self.topo.write_counters(resume.counters)
        self._restore_replays(str(resume.path))
        self.last_checkpoint = m.CheckpointInfo(str(resume.path), resume.weights_seq_no,
                                                resume.manifest.get("created_at", time.time()))
        log.info("resuming", checkpoint=str(resume.path), weights_seq_no=resume.weights_seq_no)

    def _restore_replays(self, checkpoint: str) -> None:
        """``checkpoint.save_replay``: refill each DQN policy's new replay buffer from the
        checkpoint the daemon resumes (before any role starts writing to it)."""
        if not self.cfg.checkpoint.save_replay:
            return
        from rlinkd.daemon.checkpoint.replay_files import restore_replay
        from rlinkd.shm.replay import ReplayBuffer
        for policy in self.topo.trainable():
            if policy.uses_replay:
                buffer = ReplayBuffer.attach(policy.replay_path)
                try:
                    log.info("replay_restored", policy=policy.name,
                             rows=restore_replay(checkpoint, policy.name, buffer))
                except CheckpointError as exc:  # the learner's state still resumes
                    log.warning("replay_not_restored", policy=policy.name, error=str(exc))
                finally:
                    buffer.close()

    def _install_signals(self) -> None:
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        for sig in HANDLED_SIGNALS:
            self.previous_handlers[sig] = signal.signal(sig, self._enqueue_signal)

    def _enqueue_signal(self, signum, _frame) -> None:
        self.sig_queue.append(signum)  # nothing else: no logging, no raising

    def _cleanup(self) -> None:
        signal.set_wakeup_fd(-1)
        for sig, handler in self.previous_handlers.items():  # (an in-process run goes on)
            signal.signal(sig, handler)
        if self.endpoint is not None:  # first: no scrape sees the roles go
            self.endpoint.close()
        for child in self.children.values():
            child.signal(signal.SIGKILL)
            if child.process is not None and child.process.pid is not None:
                child.process.join(2.0)
        if self._topo is not None:
            destroy_topology(self._topo)
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
            if self.exit_code is None:
                self._perform(self.core.tick(time.monotonic(), self._heartbeat_ages()))
            if not self.stopping and self.exit_code is None:
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
        while self.sig_queue and self.exit_code is None:
            name = signal.Signals(self.sig_queue.popleft()).name.lower()[3:]
            getattr(self, f"handle_{name}")()

    def _heartbeat_ages(self) -> dict[str, float]:
        now = time.monotonic()
        return {role: now - self.topo.last_heartbeat(role) for role in ROLES}

    def _reap(self) -> None:
        for role, child in self.children.items():
            code = child.reap()
            if code is not None:
                self._perform(self.core.child_exited(role, code, time.monotonic()))

    # ------------------------------------------------------------ actions
    def _perform(self, actions: list) -> None:
        """Carry out the core's actions, in order."""
        for action in actions:
            self.performers[type(action)](action)

    def _do_start(self, action: core.Start) -> None:
        child = self.children[action.role]
        child.start(child_main, (action.role, self.topo))
        self.topo.heartbeat(action.role)
        log.info("child_started", child=action.role, child_pid=child.pid,
                 restarts=self.core.roles[action.role].restarts)

    def _do_kill(self, action: core.Kill) -> None:
        self.children[action.role].signal(action.sig)

    def _do_send(self, action: core.Send) -> None:
        if not self._deliver(action.target, action.msg) and isinstance(action.msg,
                                                                       m.CheckpointRequest):
            req = action.msg
            error = "checkpointer inbox full: request not delivered"
            self._checkpoint_failed(req.request_id, req.reason, error)
            self.core.checkpoint_finished(req.request_id, error)

    def _do_shutdown_begun(self, _action: core.ShutdownBegun) -> None:
        self.notifier.stopping()

    def _do_exit(self, action: core.Exit) -> None:
        self.exit_code = action.code

    def _deliver(self, target: str, msg) -> bool:
        """Send without waiting. A full inbox (its reader hung or slow) is logged and
        counted (``undelivered_messages`` in status); the loop goes on."""
        if self.topo.inboxes[target].try_send(msg):
            return True
        self.undelivered_messages += 1
        log.warning("message_undelivered", target=target, kind=type(msg).__name__,
                    undelivered_messages=self.undelivered_messages)
        return False

    # ------------------------------------------------------------ signal handlers
    def handle_term(self) -> None:
        self._perform(self.core.terminate(time.monotonic()))

    def handle_int(self) -> None:
        self._perform(self.core.interrupt(time.monotonic()))

    def handle_usr1(self) -> None:
        self.request_checkpoint("SIGUSR1")

    def handle_hup(self) -> None:
        if not self.stopping:
            self.reload()

    def handle_chld(self) -> None:
        """Children are reaped every loop turn; SIGCHLD only wakes the loop."""

    # ------------------------------------------------------------ messages
    def on_listening(self, msg: m.Listening) -> None:
        self.listening = msg
        self._pin_port(msg.port)
        self._deliver("collector", self.info())  # status complete at once
        self._mark_ready("listening")

    def on_learner_ready(self, _msg: m.LearnerReady) -> None:
        self._mark_ready("learner")

    def on_collector_status(self, msg: m.CollectorStatus) -> None:
        self.collector_status = msg
        self.metrics.record(msg)

    def _pin_port(self, port: int) -> None:
        """With ``port = 0`` the first collector picked a port; a restarted one must reuse
        it, or reconnecting clients would knock on a closed door."""
        if self.cfg.server.port == 0:
            self.picked_port = port
            self.cfg = dataclasses.replace(self.cfg, server=dataclasses.replace(
                self.cfg.server, port=port))
            self.topo = dataclasses.replace(self.topo, cfg=self.cfg)

    def _mark_ready(self, part: str) -> None:
        if part in self.ready_parts and part != "listening":
            return
        self.ready_parts.add(part)
        listening = self.listening
        if {"listening", "learner"} <= self.ready_parts and listening is not None:
            self._write_daemon_file(listening)
            if "announced" not in self.ready_parts:
                self.ready_parts.add("announced")
                self.notifier.ready(f"listening on {listening.host}:{listening.port}")
                log.info("ready", host=listening.host, port=listening.port,
                         unix_socket=listening.unix_socket)

    def _write_daemon_file(self, listening: m.Listening) -> None:
        write_daemon_file(self.cfg.state_dir, {
            "pid": os.getpid(), "unix_socket": listening.unix_socket,
            "host": listening.host, "port": listening.port,
            "state_dir": str(self.cfg.state_dir), "runtime_dir": str(self.cfg.runtime_dir),
            "shm_dir": self.cfg.daemon.shm_dir, "started_at": self.topo.started_at,
            "metrics_url": self.endpoint.url if self.endpoint is not None else ""})

    # ------------------------------------------------------------ checkpoints
    def request_checkpoint(self, reason: str) -> None:
        """Timer and SIGUSR1: ask for a checkpoint without waiting (none while stopping).
        A SIGUSR1 request's id goes into status (``signal_checkpoint_request``): ``rlinkd
        checkpoint`` waits for the outcome of that request."""
        actions = self.core.request_checkpoint(reason)
        if reason == "SIGUSR1":
            for action in actions:
                if isinstance(action, core.Send) and isinstance(action.msg, m.CheckpointRequest):
                    self.signal_checkpoint_request = action.msg.request_id
        self._perform(actions)

    def on_checkpoint_done(self, msg: m.CheckpointDone) -> None:
        if msg.ok:
            self.checkpoints_written += 1
            self.last_checkpoint = m.CheckpointInfo(msg.path, msg.seq_no, time.time(), msg.request_id)
            self.topo.resume_checkpoint = msg.path
            log.info("checkpoint_done", path=msg.path, reason=msg.reason, weights_seq_no=msg.seq_no)
        else:
            self._checkpoint_failed(msg.request_id, msg.reason, msg.error)
        self.core.checkpoint_finished(msg.request_id, None if msg.ok else msg.error)

    def _checkpoint_failed(self, request_id: int, reason: str, error: str) -> None:
        log.error("checkpoint_failed", reason=reason, request_id=request_id, error=error)
        self.checkpoints_failed += 1
        self.last_checkpoint_failure = m.CheckpointFailure(request_id, reason, error, time.time())

    # ------------------------------------------------------------ reload
    def reload(self) -> None:
        """Re-read the config file; apply reloadable keys everywhere or change nothing."""
        self.notifier.reloading()
        self.reload_generation += 1
        try:
            loaded = load_config(self.cfg.source_file or None, self.overrides)
        except ConfigError as exc:
            log.error("reload_rejected", error=str(exc))
            self.last_reload = m.ReloadResult(self.reload_generation, False, time.time(), {}, (),
                                              str(exc))
            self.notifier.ready("reload rejected")
            return
        new = core.reload_target(self.cfg, loaded, self.picked_port)
        applied, ignored = reloadable_changes(self.cfg, new)
        self._apply(applied)
        log.info("reloaded", applied=applied, needs_restart=ignored)
        self.last_reload = m.ReloadResult(self.reload_generation, True, time.time(), applied,
                                          tuple(ignored), "")
        self.notifier.ready("reloaded")

    def _apply(self, changes: dict) -> None:
        self.cfg = apply_changes(self.cfg, changes)
        self.topo = reconfigured(self.topo, self.cfg, changes)
        logsetup.reload_level(changes, "supervisor")
        if "checkpoint.checkpoint_interval_s" in changes:
            self.timers["checkpoint"] = time.monotonic() + self.cfg.checkpoint.checkpoint_interval_s
        for role in ROLES:
            self._deliver(role, m.Reload(changes))

    # ------------------------------------------------------------ timers
    def _timers(self) -> None:
        now = time.monotonic()
        interval = self.cfg.checkpoint.checkpoint_interval_s
        if interval > 0 and now >= self.timers["checkpoint"]:
            self.timers["checkpoint"] = now + interval
            self.request_checkpoint("periodic")
        if now >= self.timers["info"]:
            self.timers["info"] = now + self.cfg.daemon.status_interval_s
            info = self.info()
            self._deliver("collector", info)
            if self.endpoint is not None:
                self.endpoint.publish(info)
        if now >= self.timers["systemd"]:
            self.timers["systemd"] = now + SYSTEMD_STATUS_EVERY_S
            self.notifier.status(self._status_line())
        if self.watchdog_s and now >= self.timers["watchdog"]:
            self.timers["watchdog"] = now + self.watchdog_s
            self.notifier.watchdog()

    def info(self) -> m.DaemonInfo:
        """The supervisor's part of ``rlinkd status``."""
        children = {role: m.ChildInfo(c.pid, self.core.roles[role].restarts, c.alive(),
                                      self.core.roles[role].last_exit)
                    for role, c in self.children.items()}
        return m.DaemonInfo(
            daemon_pid=os.getpid(), state="stopping" if self.stopping else "running",
            children=children, last_checkpoint=self.last_checkpoint,
            checkpoints_written=self.checkpoints_written, checkpoints_failed=self.checkpoints_failed,
            last_checkpoint_failure=self.last_checkpoint_failure,
            signal_checkpoint_request=self.signal_checkpoint_request,
            undelivered_messages=self.undelivered_messages,
            reload_generation=self.reload_generation, last_reload=self.last_reload,
            state_dir=str(self.cfg.state_dir), config=reloadable_values(self.cfg),
            metrics_url=self.endpoint.url if self.endpoint is not None else "")

    def _status_line(self) -> str:
        s = self.collector_status
        if s is None:
            return "starting"
        ret = "-" if s.episode_return_mean is None else f"{s.episode_return_mean:.1f}"
        return (f"{s.env_steps_per_s:.0f} steps/s, mean return {ret}, seq_no {s.weights_seq_no}, "
                f"{s.clients} clients")
