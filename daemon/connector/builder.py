"""When to build a train batch and from which segments (the connector's pure core).

Contract with the collector and learner: a batch carries ``ingest_cutoff`` such
that every complete segment whose records have ingest ids <= cutoff is either in
this batch, in an earlier one, or (off-policy only) was dropped for policy lag. The learner passes
the cutoff back with the weights it trains, and the collector releases on-policy
clients whose records are all <= cutoff.

Batches are built as late as possible: when ``train_batch_size`` steps are
buffered (or a flush was requested because every on-policy client is waiting)
*and* the learner is idle, so values and recomputed log-probs use the newest
weights. If the learner is busy, data keeps accumulating (up to the slot
capacity), which adapts the batch size to the learner's speed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rlinkd.daemon.connector.segments import Segment, grid_cut, split_segment


@dataclass
class BuildPlan:
    segments: list[Segment]
    cutoff: int
    dropped_episodes: int


@dataclass
class BatchBuilder:
    train_batch_size: int
    capacity_rows: int
    max_policy_lag: int | None   # None: never drop (on-policy: every client's data is trained)
    freshest: bool = False       # APPO: clients never wait; keep the newest steps (see ``add``)
    buffered: list[Segment] = field(default_factory=list)
    buffered_steps: int = 0
    dropped_episodes: int = 0
    dropped_steps: int = 0
    batches: int = 0
    trained_steps: int = 0
    last_cutoff: int = 0

    def add(self, segments: list[Segment]) -> None:
        """Buffer segments. With ``freshest`` (APPO: nobody waits for these steps) the buffer
        keeps about ``train_batch_size`` steps: the oldest segments beyond it are dropped (and
        counted), so each batch is the freshest train batch while clients outpace the
        learner, never a backlog left in the episode ring or an oversized batch."""
        for seg in segments:
            if seg.num_steps:
                self.buffered.append(seg)
                self.buffered_steps += seg.num_steps
        if not self.freshest:
            return
        while len(self.buffered) > 1 and self.buffered_steps - self.buffered[0].num_steps >= self.train_batch_size:
            old = self.buffered.pop(0)
            self.buffered_steps -= old.num_steps
            self.dropped_episodes += 1
            self.dropped_steps += old.num_steps

    @property
    def drains_freely(self) -> bool:
        """``freshest``: read the ring whatever the buffer holds (``add`` drops the oldest)."""
        return self.freshest

    def should_build(self, flush_requested: bool, learner_idle: bool, consumed_id: int) -> bool:
        """Full batch and idle learner; or a flush; or the buffer is about to overflow a slot."""
        if self.buffered_steps >= self.capacity_rows // 2:
            return True
        if not learner_idle:
            return False
        if self.buffered_steps >= self.train_batch_size:
            return True
        return flush_requested and (self.buffered_steps > 0 or consumed_id > self.last_cutoff)

    def take(self, current_seq: int, consumed_id: int) -> BuildPlan:
        """Remove up to ``capacity_rows`` steps of fresh-enough segments from the buffer (a
        longer segment is cut, on a recurrent policy's state grid: ``segments.grid_cut``)."""
        fresh, dropped = self._drop_stale(current_seq)
        if fresh and fresh[0].num_steps > self.capacity_rows:
            fresh[0:1] = split_segment(fresh[0], grid_cut(fresh[0].has_state, self.capacity_rows))
        chosen, rows = [], 0
        while fresh and rows + fresh[0].num_steps <= self.capacity_rows:
            seg = fresh.pop(0)
            chosen.append(seg)
            rows += seg.num_steps
        self.buffered = fresh
        self.buffered_steps = sum(s.num_steps for s in fresh)
        cutoff = min(s.first_ingest_id for s in fresh) - 1 if fresh else consumed_id
        self.last_cutoff = max(self.last_cutoff, cutoff)
        self.batches += 1
        self.trained_steps += rows
        return BuildPlan(chosen, self.last_cutoff, dropped)

    def _drop_stale(self, current_seq: int) -> tuple[list[Segment], int]:
        if self.max_policy_lag is None:
            return list(self.buffered), 0
        fresh, dropped = [], 0
        for seg in self.buffered:
            lag = current_seq - seg.behaviour_seq_no
            if seg.behaviour_seq_no >= 0 and lag > self.max_policy_lag:
                dropped += 1
                self.dropped_steps += seg.num_steps
            else:
                fresh.append(seg)
        self.dropped_episodes += dropped
        return fresh, dropped


def behaviour_versions(segments: list[Segment]) -> tuple[int, int, int]:
    """(oldest, step-weighted sum, steps) of the behaviour versions in a batch's segments.

    Only segments whose version is known count (-1: a client that sent no
    ``weights_seq_no``); a segment counts with its oldest version. The learner turns these
    into the policy lag against the version it actually trains from (max and mean).
    """
    known = [(s.behaviour_seq_no, s.num_steps) for s in segments if s.behaviour_seq_no >= 0]
    if not known:
        return -1, 0, 0
    return min(b for b, _ in known), sum(b * n for b, n in known), sum(n for _, n in known)
