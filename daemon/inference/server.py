"""The inference role's serving loop: lane areas in, batched forward passes, answers out.

Every area of a policy is mapped into one ``LaneRegion`` (one array of all their lanes), so
a turn costs a few numpy calls however many clients there are, not Python work per client.
``InferenceServer.serve_once`` is one turn, the shell around the stages of ``turn`` (turn.py:
scan -> gather -> admit -> route -> order -> execute -> publish, each decision a pure
function there): find pending requests (one vectorised scan per policy), wait up to
``inference.max_wait_us`` for more unless ``max_batch`` are pending or every open episode
has a request in, then per policy: one ``refresh`` of the weights (between batches, never
within one: a batch never mixes weight versions), the admitted lanes either through the
native lone step in ``turn.lone_order`` or through the batch path (``LaneBook.apply`` over
the policy's lane index space, one forward pass), the answers written into the lanes, the
step records handed to the policy's ``PolicyLink``, and a response doorbell rung for each
area whose client sleeps.

Owned by ``inference.process`` (which adds areas, sleeps, reconnects links, reports stats).
Nothing here blocks except ``PolicyLink.write`` when the collector's ring is full.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import structlog

from rlinkd.client_lib.protocol.serving import EvalEpisode
from rlinkd.client_lib.protocol.spaces import Space
from rlinkd.daemon.config import NATIVE_PARTS
from rlinkd.daemon.inference.backend import PolicyRunner
from rlinkd.daemon.inference.episodes import LaneBook, Requests, SlotPool, concat
from rlinkd.daemon.inference.link import PolicyLink
from rlinkd.daemon.inference import turn
from rlinkd.daemon.inference.lonestep import END, EVAL_END, START, LoneStepper
from rlinkd.daemon.inference.policy_lanes import PolicyLanes, ServedArea
from rlinkd.shm.errors import ShmError
from rlinkd.shm.lanes import SLEEPING_OFFSET

log = structlog.get_logger("inference")
WAIT_SLICE_S = 50e-6
HISTOGRAM_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


@dataclass
class ServingStats:
    requests: int = 0
    actions: int = 0
    batches: int = 0
    errors: int = 0
    histogram: list[int] = field(default_factory=lambda: [0] * len(HISTOGRAM_BOUNDS))

    def batch(self, size: int) -> None:
        self.batches += 1  # the bounds are the powers of two: bucket = ceil(log2(size))
        self.histogram[min((size - 1).bit_length(), len(HISTOGRAM_BOUNDS) - 1)] += 1

    def lone(self, count: int) -> None:
        """``count`` lone requests answered natively: a batch of one action each."""
        self.batches += count
        self.histogram[0] += count
        self.actions += count
        self.requests += count


@dataclass
class PolicyServing:
    """What the loop needs per policy: its runner, spaces, slot pool and (trainable) link."""

    runner: PolicyRunner
    obs_space: Space
    slots: SlotPool
    link: PolicyLink | None
    sample_steps: int
    eval_ends: list[EvalEpisode] = field(default_factory=list)
    off_policy: bool = False  # DQN: never held for training; WEIGHTS_READY still asked for (epsilon)
    lone: LoneStepper | None = None  # (made with the policy's lanes: its spaces allow the native step)

    @property
    def held(self) -> bool:
        """Training requests wait: for weights trained on the last sample (on-policy), or for
        the link to the collector (its steps would be lost)."""
        return self.link is not None and (self.link.held or not self.link.connected)


class InferenceServer:
    """Serving state of the inference role (areas by id, policies by name, their lanes)."""

    def __init__(self, policies: dict[str, PolicyServing], max_batch: int, max_wait_s: float,
                 on_policy: bool, native_parts: tuple[str, ...] = NATIVE_PARTS) -> None:
        self.policies, self.max_batch, self.max_wait_s = policies, max_batch, max_wait_s
        self.on_policy = on_policy
        self.native_parts = native_parts  # (``inference.native_parts``: here scan and step)
        self.areas: dict[int, ServedArea] = {}
        self.lanes: dict[str, PolicyLanes] = {}
        self.stats = ServingStats()
        self.scan_due = True
        self.while_gathering: Callable[[], None] = lambda: None  # (each slice of _gather_wait)

    # ------------------------------------------------------------ areas
    def add(self, served: ServedArea, fd: int) -> None:
        """Serve an area whose ``LaneArea`` was checked; ``fd`` (kept by the caller) is mapped
        into the policy's region. ``ShmError`` when the region is full."""
        if served.policy not in self.lanes:
            policy = self.policies[served.policy]
            self.lanes[served.policy] = PolicyLanes(served.area.layout, policy.slots,
                                                    policy.runner.spec.max_seq_len,
                                                    native="scan" in self.native_parts)
            policy.lone = (LoneStepper.maybe(policy.runner, served.area.layout)
                           if "step" in self.native_parts else None)
        self.remove(served.area_id)
        self.lanes[served.policy].place(fd, served)
        self.areas[served.area_id] = served
        self.scan_due = True  # (its client may have published before it was mapped)

    def remove(self, area_id: int) -> None:
        """A client went away: end its open training fragments (truncated), unmap."""
        served = self.areas.pop(area_id, None)
        if served is None:
            return
        self._send(served.policy, self.forget(served), 0)
        self.lanes[served.policy].drop(served)
        served.close()

    def forget(self, served: ServedArea) -> np.ndarray:
        """Close every episode of the area's lanes; returns their final records."""
        pl = self.lanes[served.policy]
        pl.deferred[served.where.lanes] = False  # (any_deferred may stay set: harmless)
        return pl.book.drop(served.where.lanes)

    def native_in_use(self) -> set[str]:
        """The native parts serving now: ``scan`` where a policy's lanes scan natively,
        ``step`` where a policy's lone requests can go native (its runner runs natively at
        batch 1), ``net`` where a policy's forward pass is the native interpreter."""
        used = {"scan"} if any(pl.scan is not None for pl in self.lanes.values()) else set()
        for policy in self.policies.values():
            if policy.lone is not None and policy.lone.ready(policy.runner):
                used.add("step")
            if "native" in policy.runner.backends:
                used.add("net")
        return used

    def open_lanes(self) -> int:
        return sum(int(np.count_nonzero(pl.book.open)) for pl in self.lanes.values())

    def announce_sleep(self, sleeping: bool) -> None:
        """Set (before sleeping) or clear (after) ``server_sleeping`` in every area header."""
        for pl in self.lanes.values():
            pl.region.headers[:, SLEEPING_OFFSET // 4] = int(sleeping)

    def close(self) -> None:
        for area_id in list(self.areas):
            self.remove(area_id)
        for pl in self.lanes.values():
            pl.close()
        self.lanes.clear()

    # ------------------------------------------------------------ one turn
    def arrivals(self) -> int:
        """Requests not looked at yet, over every area (one vectorised scan per policy)."""
        return sum(pl.arrivals(self.policies[name].held) for name, pl in self.lanes.items())

    def fresh_arrivals(self) -> int:
        """Requests that arrived since the last turn (pending, and not left pending by it:
        an incomplete group, a policy held or without weights): a full scan, so the next
        ``serve_once`` scans too when it finds some (even ones no request counter shows)."""
        n = sum(pl.arrivals(True) for pl in self.lanes.values())
        self.scan_due = self.scan_due or n > 0
        return n

    def published_since(self) -> bool:
        """Cheap: some area published a request since the last turn's scan."""
        return any(pl.published_since() for pl in self.lanes.values())

    def serve_once(self) -> int:
        """Answer what is pending (after batching up to ``max_wait_s``). Returns requests answered.
        No scan when no area counted a request since the last one, nothing was left pending
        then (a turn answers or defers every pending lane) and no ``fresh_arrivals`` scan
        found one since."""
        if not self.scan_due and not any(pl.any_deferred or pl.published_since()
                                         for pl in self.lanes.values()):
            return 0
        full, self.scan_due = self.scan_due, False
        pend = {name: pl.pending(turn.scan_scope(full, pl.any_deferred, pl.snapshot()))
                for name, pl in self.lanes.items()}  # (one scan per turn)
        arrived = sum(pl.arrivals(self.policies[name].held, pend[name]) for name, pl in self.lanes.items())
        if not arrived:
            return 0
        if self._gather_wait(arrived):
            pend = {name: pl.pending() for name, pl in self.lanes.items()}
        answered = 0
        for name, pl in self.lanes.items():
            idx = self._admit(name, pl, pend[name])
            if len(idx):
                answered += self._serve_policy(name, pl, idx)
        return answered

    def _gather_wait(self, arrived: int) -> bool:
        """Wait in short slices while fewer than ``max_batch`` requests arrived (``arrived``
        at this turn's scan), some open episode has none in, and the first one has waited
        less than the wait allowed (``gather_limit_s``). True if it waited (more may have
        arrived)."""
        limit = self.gather_limit_s()
        want = turn.gather_want(limit, self.max_batch, self.open_lanes(), arrived)
        if not want:
            return False
        deadline = time.perf_counter() + limit
        waited = False
        while self.arrivals() < want and (left := deadline - time.perf_counter()) > 0:
            if left > 2 * WAIT_SLICE_S:
                time.sleep(WAIT_SLICE_S)
            else:  # (a sleep this short overshoots by tens of us)
                os.sched_yield()
            self.while_gathering()
            waited = True
        return waited

    def gather_limit_s(self) -> float:
        """``turn.gather_limit_s`` over every policy's batch-1 pass."""
        return turn.gather_limit_s(self.max_wait_s, (p.runner.batch1_s for p in self.policies.values()))

    def _admit(self, name: str, pl: PolicyLanes, pending: np.ndarray) -> np.ndarray:
        """The admit stage (``turn.admit``) over this turn's ``pending()`` lanes; the rest
        are left pending (``deferred``)."""
        idx = turn.admit(pl.region.lanes, pl.region.owner, pending, self.policies[name].held,
                         pl.book.open, pl.book.evaluate)
        pl.keep_pending(pending, idx)
        return idx

    # ------------------------------------------------------------ one policy
    def _serve_policy(self, name: str, pl: PolicyLanes, idx: np.ndarray) -> int:
        """Every ready request of one policy: one weights refresh, the lane bookkeeping, one
        observation check and one forward pass over all of them, answers into the lanes,
        step records to the policy's link, the sleeping clients rung."""
        policy = self.policies[name]
        runner = policy.runner
        if not policy.held or not runner.ready:  # (held: keep the version it sampled with)
            runner.refresh()
        if not runner.ready:  # no weights yet (learner booting): leave them pending
            pl.defer(idx)
            return 0
        served = 0
        if turn.route_natively(len(idx), runner.batch1_s, policy.lone is not None and policy.lone.ready(runner)):
            idx, served = self._serve_natively(name, policy, pl, idx)
            if not len(idx):
                return served
        req = Requests.read(pl.region.lanes, idx)
        bad = runner.bad_rows(req.obs)
        if len(req) == 1:
            self._serve_one(name, policy, pl, req, bool(bad[0]))
        else:
            self._serve_many(name, policy, pl, req, bad)
        pl.wake(idx)
        return served + len(req)

    def _serve_natively(self, name: str, policy: PolicyServing, pl: PolicyLanes,
                        idx: np.ndarray) -> tuple[np.ndarray, int]:
        """The order and execute stages for lone clients' requests: in ``turn.lone_order``
        (ENDs first), runs of them per native call (``_lone_run``) until done or until a
        sample cut holds the policy, which leaves the rest (``turn.after_cut``) for the next
        turns, as that many turns of one request would. Returns (the grouped lanes, left to
        the batch path; requests served here)."""
        order, left = turn.lone_order(pl.region.lanes, idx)
        was_held, pos = policy.held, 0
        while pos < len(order) and not (policy.held and not was_held):
            pos = self._lone_run(name, policy, pl, order, pos)
        if policy.held and not was_held:  # (a sample cut: nothing more with these weights)
            pl.defer(turn.after_cut(order, pos, left))
            left = left[:0]
        if pos:
            pl.wake(order[:pos])
        return left, pos

    def _lone_run(self, name: str, policy: PolicyServing, pl: PolicyLanes, order: np.ndarray, pos: int) -> int:
        """One native call from ``order[pos]`` (``LoneStepper.serve``: it stops at the sample
        boundary and where an episode starts or ends, ``_native_event``), its records handed
        on, then ``_serve_one`` for a request it declined. Returns the next position."""
        lone, runner, lanes = policy.lone, policy.runner, pl.region.lanes
        assert lone is not None
        link = policy.link
        cutting = link is not None and link.connected and not link.held
        max_steps = turn.steps_to_boundary(policy.sample_steps, 0 if link is None else link.steps, cutting)
        nxt, records, steps, declined, event = lone.serve(lanes, order, pos, pl.book, runner, max_steps)
        answered = nxt - pos
        if event is not None:
            answered -= self._native_event(name, policy, pl, int(order[nxt - 1]), event)
        self.stats.lone(answered)
        if records or steps:
            self._send(name, lone.records[:records], steps)
        if declined:  # (the Python path, for this one request)
            req = Requests.read(lanes, order[nxt:nxt + 1])
            self._serve_one(name, policy, pl, req, bool(runner.bad_rows(req.obs)[0]))
            nxt += 1
        return nxt

    def _native_event(self, name: str, policy: PolicyServing, pl: PolicyLanes, lane: int, event: tuple) -> int:
        """What ``LoneStepper.serve`` left to Python about ``lane``'s episode (see there).
        Returns 1 for an END (a request answered without an action), else 0."""
        kind = event[0]
        if kind == START:
            LoneStepper.take_slot(pl.book, lane)
            return 0
        self.stats.requests += 1
        if kind == EVAL_END:
            _, episode_return, length, seq = event
            policy.eval_ends.append(EvalEpisode(episode_return, length, seq, policy_id=name))
        else:
            assert kind == END, event
            if event[1] >= 0:  # (the training episode's slot goes back)
                pl.book.slots.give(int(event[1]))
        return 1

    def _serve_many(self, name: str, policy: PolicyServing, pl: PolicyLanes, req: Requests,
                    bad: np.ndarray) -> None:
        runner, lanes, seq = policy.runner, pl.region.lanes, policy.runner.weights_seq_no
        out = pl.book.apply(req, bad)
        wants = out.wants_action
        n = int(np.count_nonzero(wants))
        if n:
            sel = req.lanes[wants]
            actions, logp, dist, state_out = act(runner, pl.book, req.obs[wants], out.explore[wants], sel)
            lanes["action"][sel], lanes["logp"][sel] = actions, logp
            pl.book.remember(req, wants, actions, logp, dist, seq, state_out)
            self.stats.batch(n)
            self.stats.actions += n
        lanes["status"][req.lanes], lanes["weights_seq_no"][req.lanes] = out.status, seq
        lanes["resp_seq"][req.lanes] = req.seqs
        self.stats.requests += len(req)
        self.stats.errors += int(np.count_nonzero(out.status))
        policy.eval_ends += [EvalEpisode(e.episode_return, e.episode_length, e.weights_seq_no,
                                         policy_id=name) for e in out.eval_ends]
        if len(out.records) or out.train_steps:
            self._send(name, out.records, out.train_steps)

    def _serve_one(self, name: str, policy: PolicyServing, pl: PolicyLanes, req: Requests,
                   bad: bool) -> None:
        """``_serve_many`` for a lone request, in scalar code (a lone client's every step)."""
        runner, lane, book = policy.runner, int(req.lanes[0]), pl.book
        out: list[np.ndarray] = []
        status, wants, explore, ended, steps = book.apply_one(
            lane, int(req.ops[0]), int(req.flags[0]), float(req.rewards[0]), req.obs[0], bad, out)
        row = pl.region.lanes[lane]
        if wants:
            actions, logp, dist, state_out = act(runner, book, req.obs, np.array([explore]), req.lanes)
            row["action"], row["logp"] = actions[0], logp[0]
            book.remember_one(lane, req.obs[0], actions[0], float(logp[0]), dist[0], runner.weights_seq_no,
                              None if state_out is None else state_out[0])
            self.stats.batch(1)
            self.stats.actions += 1
        row["status"], row["weights_seq_no"] = status, runner.weights_seq_no
        row["resp_seq"] = req.seqs[0]
        self.stats.requests += 1
        self.stats.errors += status != 0
        if ended is not None:
            policy.eval_ends.append(EvalEpisode(ended.episode_return, ended.episode_length,
                                                ended.weights_seq_no, policy_id=name))
        if out or steps:
            self._send(name, concat(out, book.layout), steps)

    # ------------------------------------------------------------ steps out
    def _send(self, name: str, records: np.ndarray, train_steps: int) -> None:
        """Hand step records to the policy's link; at a sample boundary cut every fragment
        of the policy and send SAMPLE_READY (on-policy: hold the policy)."""
        policy = self.policies[name]
        link = policy.link
        if link is None or not link.connected:
            return  # a frozen policy's served steps train nothing (as client-side)
        try:
            link.write(records, train_steps)
            if link.steps >= policy.sample_steps and not link.held:
                link.write(self.lanes[name].book.cut(), 0)
                link.sample_ready(self.on_policy or policy.off_policy)
        except (ConnectionError, OSError, ShmError) as exc:  # the collector restarts: reconnect
            log.info("inference_link_lost", policy=name, error=str(exc))
            link.close()

    def flush_links(self, only_old: bool = False) -> None:
        """Write every link's queued step records (``only_old``: those queued ``COALESCE_S``
        ago; the shell calls it after each turn, and with False before it idles)."""
        for name, policy in self.policies.items():
            link = policy.link
            if link is None or not link.connected or not link.queued:
                continue
            try:
                link.flush(only_old)
            except (ConnectionError, OSError, ShmError) as exc:  # the collector restarts: reconnect
                log.info("inference_link_lost", policy=name, error=str(exc))
                link.close()

    def flush_due_in_s(self) -> float | None:
        """Seconds until some link's queued step records are due (None: nothing queued)."""
        due = [d for p in self.policies.values() if p.link is not None and p.link.connected
               and (d := p.link.due_in_s()) is not None]
        return min(due, default=None)

    def flush_eval(self) -> None:
        """Send finished evaluation episodes (called by the shell about twice a second)."""
        links = [p.link for p in self.policies.values() if p.link is not None and p.link.connected]
        for policy in self.policies.values():
            if policy.eval_ends and links:
                links[0].send_eval(policy.eval_ends)
                policy.eval_ends = []


def act(runner: PolicyRunner, book: LaneBook, obs_rows: np.ndarray, explore: np.ndarray,
        lanes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """(actions, logp, dist, state out or None) for the lanes' observations: a recurrent
    policy's forward is fed the lanes' states (``LaneBook.state``)."""
    if not book.max_seq_len:
        return (*runner.act(obs_rows, explore), None)
    return runner.act_with_state(obs_rows, explore, book.state[lanes])
