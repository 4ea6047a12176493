"""The inference role's serving loop: lane areas in, batched forward passes, answers out.

``InferenceServer.serve_once`` is one turn: find pending requests on every lane area
(skipping areas whose request counter did not move), wait up to ``inference.max_wait_us``
for more unless ``max_batch`` are pending or every open episode has a request in, then per
policy: one ``refresh`` of the weights (between batches, never within one: a batch never
mixes weight versions), the lane bookkeeping (``LaneBook.apply``), one forward pass over the
requests of every area, the answers written into the lanes, the step records handed to
the policy's ``PolicyLink``, and a response doorbell rung for each area whose client sleeps.

Owned by ``inference.process`` (which adds areas, sleeps, reconnects links, reports stats).
Nothing here blocks except ``PolicyLink.write`` when the collector's ring is full.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import structlog

from rlinkd.client_lib.protocol.serving import EvalEpisode
from rlinkd.client_lib.protocol.spaces import Space
from rlinkd.daemon.inference.backend import PolicyRunner
from rlinkd.daemon.inference.episodes import LaneBook, Outcome, Requests, SlotPool, concat
from rlinkd.daemon.inference.link import PolicyLink
from rlinkd.shm._sync import store_load_fence
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.errors import ShmError
from rlinkd.shm.lanes import EVALUATE, OP_END, OP_RELEASE, OP_START, LaneArea

log = structlog.get_logger("inference")
WAIT_SLICE_S = 50e-6
EMPTY = np.empty(0)  # placeholder records of a scalar-path Outcome (its records go to the list)
HISTOGRAM_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


@dataclass
class ServedArea:
    """One lane area being served: a shm client's, or the collector's TCP lanes of a policy."""

    area_id: int
    area: LaneArea
    book: LaneBook
    policy: str
    bell: Doorbell
    seen: int = -1          # the area's request counter at the last scan
    deferred: bool = False  # requests left pending (their policy was held)
    shared_bell: bool = False  # the bell belongs to the collector (do not close it)

    def close(self) -> None:
        self.area.close()
        if not self.shared_bell:
            self.bell.close()


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

    @property
    def held(self) -> bool:
        """Training requests wait: for weights trained on the last sample (on-policy), or for
        the link to the collector (its steps would be lost)."""
        return self.link is not None and (self.link.held or not self.link.connected)


class InferenceServer:
    """Serving state of the inference role (areas by id, policies by name)."""

    def __init__(self, policies: dict[str, PolicyServing], max_batch: int, max_wait_s: float,
                 on_policy: bool) -> None:
        self.policies, self.max_batch, self.max_wait_s = policies, max_batch, max_wait_s
        self.on_policy = on_policy
        self.areas: dict[int, ServedArea] = {}
        self.stats = ServingStats()

    # ------------------------------------------------------------ areas
    def add(self, area: ServedArea) -> None:
        self.areas[area.area_id] = area

    def remove(self, area_id: int) -> None:
        """A client went away: end its open training fragments (truncated), unmap."""
        served = self.areas.pop(area_id, None)
        if served is None:
            return
        self._send(served.policy, served.book.drop_all(), 0)
        served.close()

    def open_lanes(self) -> int:
        return sum(int(np.count_nonzero(a.book.open)) for a in self.areas.values())

    # ------------------------------------------------------------ one turn
    def arrivals(self) -> int:
        """Requests published since the last scan, over every area (cheap: counters only)."""
        return sum(a.area.requests - a.seen for a in self.areas.values() if a.seen >= 0) + sum(
            1 for a in self.areas.values()
            if a.seen < 0 or (a.deferred and not self.policies[a.policy].held))

    def serve_once(self) -> int:
        """Answer what is pending (after batching up to ``max_wait_s``). Returns requests answered."""
        if not self.arrivals():
            return 0
        self._gather_wait()
        by_policy = self._gather()
        answered = 0
        touched: list[ServedArea] = []
        for policy, items in by_policy.items():
            answered += self._serve_policy(policy, items)
            touched += [a for a, _ in items]
        if touched:
            store_load_fence()
            for served in touched:
                if served.area.take_client_waiting():
                    served.bell.ring()
        return answered

    def _gather_wait(self) -> None:
        """Sleep in short slices while fewer than ``max_batch`` requests arrived, some open
        episode has none in, and the first one has waited less than ``max_wait_s``."""
        if self.max_wait_s <= 0:
            return
        deadline = time.perf_counter() + self.max_wait_s
        want = min(self.max_batch, max(1, self.open_lanes()))
        while self.arrivals() < want and time.perf_counter() < deadline:
            time.sleep(WAIT_SLICE_S)

    def _gather(self) -> dict[str, list[tuple[ServedArea, Requests]]]:
        out: dict[str, list[tuple[ServedArea, Requests]]] = {}
        for served in self.areas.values():
            count = served.area.requests
            if count == served.seen and not served.deferred:
                continue
            served.seen = count
            idx, incomplete = served.area.ready()  # a group (STEP_BATCH) only when complete
            policy = self.policies[served.policy]
            if policy.held and len(idx):
                keep = self._serveable_while_held(served, idx)
                served.deferred = incomplete or len(keep) < len(idx)
                idx = keep
            else:
                served.deferred = incomplete
            if len(idx):
                out.setdefault(served.policy, []).append((served, Requests.read(served.area.lanes, idx)))
        return out

    @staticmethod
    def _serveable_while_held(served: ServedArea, idx: np.ndarray) -> np.ndarray:
        """While a policy waits for weights: ends, releases and evaluation lanes go on."""
        lanes = served.area.lanes
        ops, flags = lanes["op"][idx], lanes["flags"][idx]
        book = served.book
        ok = ((ops == OP_END) | (ops == OP_RELEASE) | ((ops == OP_START) & ((flags & EVALUATE) != 0))
              | ((ops != OP_START) & book.open[idx] & book.evaluate[idx]))
        groups = lanes["group"][idx]
        held_groups = np.unique(groups[~ok & (groups != 0)])  # a group goes whole or waits whole
        return idx[ok & ~np.isin(groups, held_groups)]

    # ------------------------------------------------------------ one policy
    def _serve_policy(self, name: str, items: list[tuple[ServedArea, Requests]]) -> int:
        """Every pending request of one policy: lane bookkeeping per area (scalar code for an
        area with one request, the common case), one observation check and one forward pass
        over all of them, answers into the lanes, step records to the policy's link."""
        policy = self.policies[name]
        runner = policy.runner
        if not policy.held or not runner.ready:  # (held: keep the version it sampled with)
            runner.refresh()
        if not runner.ready:
            for served, _req in items:  # no weights yet (learner booting): leave them pending
                served.deferred = True
            return 0
        if len(items) == 1 and len(items[0][1]) == 1:
            return self._serve_one(name, policy, *items[0])
        bad = runner.bad_rows(items[0][1].obs if len(items) == 1 else
                              stack([req.obs for _, req in items]))
        records: list[np.ndarray] = []
        outcomes, steps, start = [], 0, 0
        for served, req in items:
            out = self._apply(name, policy, served, req, bad[start:start + len(req)], records)
            start += len(req)
            steps += out.train_steps
            outcomes.append(out)
        self._act(runner, [(served, req, out) for (served, req), out in zip(items, outcomes)])
        for (served, req), out in zip(items, outcomes):
            self._answer(served, req, out, runner.weights_seq_no)
        if records or steps:
            self._send(name, concat(records, items[0][0].book.layout), steps)
        return start

    def _serve_one(self, name: str, policy: PolicyServing, served: ServedArea, req: Requests) -> int:
        """``_serve_policy`` for a lone request, without batch bookkeeping (a lone client's
        every step: ~20 us less)."""
        runner, lane = policy.runner, int(req.lanes[0])
        out: list[np.ndarray] = []
        status, wants, explore, ended, steps = served.book.apply_one(
            lane, int(req.ops[0]), int(req.flags[0]), float(req.rewards[0]), req.obs[0],
            bool(runner.bad_rows(req.obs)[0]), out)
        row = served.area.lanes[lane]
        if wants:
            actions, logp, dist = runner.act(req.obs, np.array([explore]))
            row["action"], row["logp"] = actions[0], logp[0]
            served.book.remember_one(lane, req.obs[0], actions[0], float(logp[0]), dist[0],
                                     runner.weights_seq_no)
            self.stats.batch(1)
            self.stats.actions += 1
        row["status"], row["weights_seq_no"] = status, runner.weights_seq_no
        served.area.answer(req.lanes, req.seqs)
        self.stats.requests += 1
        self.stats.errors += status != 0
        if ended is not None:
            policy.eval_ends.append(EvalEpisode(ended.episode_return, ended.episode_length,
                                                ended.weights_seq_no, policy_id=name))
        if out or steps:
            self._send(name, concat(out, served.book.layout), steps)
        return 1

    def _apply(self, name: str, policy: PolicyServing, served: ServedArea, req: Requests,
               bad: np.ndarray, records: list[np.ndarray]) -> Outcome:
        """``LaneBook.apply`` (or ``apply_one`` for a lone request); finished evaluation
        episodes are queued for EVAL_RESULTS."""
        if len(req) == 1:
            status, wants, explore, ended, steps = served.book.apply_one(
                int(req.lanes[0]), int(req.ops[0]), int(req.flags[0]), float(req.rewards[0]),
                req.obs[0], bool(bad[0]), records)
            out = Outcome(np.array([status], np.int32), np.array([wants]), np.array([explore]),
                          EMPTY, [ended] if ended is not None else [], steps)
        else:
            out = served.book.apply(req, bad)
            records.append(out.records)
        policy.eval_ends += [EvalEpisode(e.episode_return, e.episode_length, e.weights_seq_no,
                                         policy_id=name) for e in out.eval_ends]
        return out

    def _act(self, runner: PolicyRunner, acting: list[tuple[ServedArea, Requests, Outcome]]) -> None:
        """One forward pass over every request that wants an action; results go into the lanes
        and become the lanes' pending steps."""
        rows = [out.wants_action for _, _, out in acting]
        counts = [int(np.count_nonzero(r)) for r in rows]
        n = sum(counts)
        if not n:
            return
        if len(acting) == 1:
            obs, explore = acting[0][1].obs[rows[0]], acting[0][2].explore[rows[0]]
        else:
            obs = stack([req.obs[r] for (_, req, _), r in zip(acting, rows)])
            explore = np.concatenate([out.explore[r] for (_, _, out), r in zip(acting, rows)])
        actions, logp, dist = runner.act(obs, explore)
        self.stats.batch(n)
        self.stats.actions += n
        start = 0
        for (served, req, _), r, k in zip(acting, rows, counts):
            if k == 1 and len(req) == 1:
                lane = int(req.lanes[0])
                row = served.area.lanes[lane]
                row["action"], row["logp"] = actions[start], logp[start]
                served.book.remember_one(lane, req.obs[0], actions[start], float(logp[start]),
                                         dist[start], runner.weights_seq_no)
            elif k:
                lanes, sel = served.area.lanes, req.lanes[r]
                lanes["action"][sel] = actions[start:start + k]
                lanes["logp"][sel] = logp[start:start + k]
                served.book.remember(req, r, actions[start:start + k], logp[start:start + k],
                                     dist[start:start + k], runner.weights_seq_no)
            start += k

    def _answer(self, served: ServedArea, req: Requests, out: Outcome, seq: int) -> None:
        lanes = served.area.lanes
        if len(req) == 1:
            row = lanes[int(req.lanes[0])]
            row["status"], row["weights_seq_no"] = out.status[0], seq
        else:
            lanes["status"][req.lanes] = out.status
            lanes["weights_seq_no"][req.lanes] = seq
        served.area.answer(req.lanes, req.seqs)
        self.stats.requests += len(req)
        self.stats.errors += int(np.count_nonzero(out.status))

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
                cuts = [a.book.cut() for a in self.areas.values() if a.policy == name]
                link.write(concat(cuts, link.layout), 0)
                link.sample_ready(self.on_policy or policy.off_policy)
        except (ConnectionError, OSError, ShmError) as exc:  # the collector restarts: reconnect
            log.info("inference_link_lost", policy=name, error=str(exc))
            link.close()

    def flush_eval(self) -> None:
        """Send finished evaluation episodes (called by the shell about twice a second)."""
        links = [p.link for p in self.policies.values() if p.link is not None and p.link.connected]
        for policy in self.policies.values():
            if policy.eval_ends and links:
                links[0].send_eval(policy.eval_ends)
                policy.eval_ends = []


def stack(parts: list[np.ndarray]) -> np.ndarray:
    """Structured rows joined (np.concatenate promotes structured dtypes field by field:
    ten times slower for many small parts)."""
    out = np.empty(sum(len(p) for p in parts), parts[0].dtype)
    start = 0
    for p in parts:
        out[start:start + len(p)] = p
        start += len(p)
    return out
