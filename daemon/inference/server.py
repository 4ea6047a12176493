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
the policy's lane index space, one forward pass): the execute stage, execute.py; the step
records handed to the policy's ``PolicyLink``: the publish stage, publish.py; and a
response doorbell rung for each area whose client sleeps.

Owned by ``inference.process`` (which adds areas, sleeps, reconnects links, reports stats).
Nothing here blocks except ``PolicyLink.write`` when the collector's ring is full.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np

from rlinkd.daemon.config import NATIVE_PARTS
from rlinkd.daemon.inference import turn
from rlinkd.daemon.inference.episodes import Requests
from rlinkd.daemon.inference.execute import Executor
from rlinkd.daemon.inference.lonestep import LoneStepper
from rlinkd.daemon.inference.policy_lanes import PolicyLanes, ServedArea
from rlinkd.daemon.inference.policy_serving import PolicyServing, ServingStats
from rlinkd.daemon.inference.publish import Publisher
from rlinkd.shm.lanes import SLEEPING_OFFSET

WAIT_SLICE_S = 50e-6


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
        self.publish = Publisher(policies, self.lanes, on_policy)  # (the publish stage)
        self.execute = Executor(self.stats, self.publish)         # (the execute stage)
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

    def link_connected(self, name: str) -> None:
        """Policy ``name``'s link was (re)connected: its open lanes start new fragments."""
        if (lanes := self.lanes.get(name)) is not None:
            lanes.book.new_fragments()

    def remove(self, area_id: int) -> None:
        """A client went away: end its open training fragments (truncated), unmap."""
        served = self.areas.pop(area_id, None)
        if served is None:
            return
        self.publish.send(served.policy, self.forget(served), 0)
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
            idx, served = self.execute.natively(name, policy, pl, idx)
            if not len(idx):
                return served
        req = Requests.read(pl.region.lanes, idx)
        bad = runner.bad_rows(req.obs)
        if len(req) == 1:
            self.execute.one(name, policy, pl, req, bool(bad[0]))
        else:
            self.execute.many(name, policy, pl, req, bad)
        pl.wake(idx)
        return served + len(req)
