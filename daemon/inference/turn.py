"""The stages of one serving turn, as pure functions of what the turn has read.

``InferenceServer.serve_once`` (server.py) is the shell that reads the lanes and calls them
in this order, per policy:

    scan     which lanes to look at (``scan_scope``), then ``PolicyLanes.pending``
    gather   how long the first request may wait for others (``gather_limit_s``, ``gather_want``)
    admit    which pending lanes are answered now, which wait (``admit``)
    route    native lone step or the batch path (``route_natively``)
    order    the lone requests' order, ENDs first (``lone_order``), and where a sample cut
             leaves the rest for later turns (``after_cut``, ``steps_to_boundary``)
    execute  ``LoneStepper.serve`` / ``LaneBook.apply`` + one forward pass (the shell)
    publish  answers into the lanes, step records to the link, doorbells rung (the shell)

The ordering rules that past bugs broke are properties of ``admit`` and of the order stage
(tests/unit/test_turn.py):

- no training request is answered with the weights of a sample already cut: while a policy
  is held only ENDs, RELEASEs and evaluation lanes are admitted, and a cut in the middle of
  a turn leaves every request after it (lone or grouped) for the next turns;
- an END gives back its agent slot before a START of the same turn takes one: ``lone_order``
  puts ENDs first, as ``LaneBook.apply`` orders a batch;
- a group (a vector client's act) is answered whole in one pass or waits whole.

Nothing here touches shared memory, sockets or clocks; every function reads arrays it is
given and returns new ones.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from rlinkd.daemon.inference.lonestep import MAX_RECORDS
from rlinkd.shm.lanes import EVALUATE, OP_END, OP_RELEASE, OP_START, complete_groups

NATIVE_BUDGET_S = 1e-3  # a turn's lone requests go through the native step one by one while their
NATIVE_MIN_REQUESTS = 16  # batch-1 passes take about this long in all, but at least this many (a
NATIVE_MAX_REQUESTS = 1024  # slow net's 16 may take longer) and at most this many (a CartPole MLP's
                            # ~3 us: ~290; for a net that small one by one is cheaper even at 1,024:
                            # 2.6 against 3.8 us a request in-process)
GATHER_FORWARDS = 2.0  # a turn's first request waits for others at most this many batch-1 passes
MIN_GATHER_S = 50e-6  # ... and not at all when that is less than this


# ------------------------------------------------------------ scan
def scan_scope(full: bool, any_deferred: bool, moved: np.ndarray | None) -> np.ndarray | None:
    """The header slots to scan: None (every area) when a full scan is due or lanes were
    left pending last turn (they are in areas whose counter did not move), else ``moved``."""
    return None if full or any_deferred else moved


# ------------------------------------------------------------ gather
def gather_limit_s(max_wait_s: float, batch1_s: Iterable[float]) -> float:
    """How long the first request of a turn may wait for others: ``max_wait_s``, but at
    most GATHER_FORWARDS batch-1 forward passes of the slowest policy (what batching two
    requests saves is about one pass: a CartPole MLP's few microseconds are not worth a
    200 us wait, which halved the rate of two lockstep clients; an image network's or a
    GPU's hundreds are)."""
    return min(max_wait_s, GATHER_FORWARDS * max(batch1_s, default=0.0))


def gather_want(limit_s: float, max_batch: int, open_lanes: int, arrived: int) -> int:
    """How many requests the turn waits for (0: do not wait): up to ``max_batch``, or one
    per open episode; no wait below MIN_GATHER_S (one look at the lanes costs about that)
    or when ``arrived`` already reaches it."""
    want = min(max_batch, max(1, open_lanes))
    return 0 if limit_s < MIN_GATHER_S or arrived >= want else want


# ------------------------------------------------------------ admit
def admit(lanes: np.ndarray, owner: np.ndarray, pending: np.ndarray, held: bool,
          open_: np.ndarray, evaluate: np.ndarray) -> np.ndarray:
    """The ``pending`` lanes to answer now (the rest wait for a later turn): a lone
    client's request, or groups wholly pending; while the policy is ``held`` (its sample
    cut, weights not yet trained on it) only what ``serveable_while_held`` lets go on."""
    lone = len(pending) == 1 and not lanes["group"][pending[0]]  # (a lone client's request)
    idx = pending if lone else complete_groups(lanes, pending, owner)
    if held and len(idx):
        idx = serveable_while_held(lanes, owner, open_, evaluate, idx)
    return idx


def serveable_while_held(lanes: np.ndarray, owner: np.ndarray, open_: np.ndarray, evaluate: np.ndarray,
                         idx: np.ndarray) -> np.ndarray:
    """While a policy waits for weights: ends, releases and evaluation lanes go on (a group
    goes whole or waits whole). ``open_``/``evaluate``: per lane, its episode is open / is
    an evaluation episode (``LaneBook``)."""
    ops, flags = lanes["op"][idx], lanes["flags"][idx]
    ok = ((ops == OP_END) | (ops == OP_RELEASE) | ((ops == OP_START) & ((flags & EVALUATE) != 0))
          | ((ops != OP_START) & open_[idx] & evaluate[idx]))
    groups = lanes["group"][idx]
    key = (owner[idx] << 32) | groups.astype(np.int64)
    held = np.unique(key[~ok & (groups != 0)])
    return idx[ok & ~np.isin(key, held)]


# ------------------------------------------------------------ route
def native_limit(batch1_s: float) -> int:
    """How many admitted lanes a turn may serve through the native step (more: the batch path)."""
    fits = NATIVE_BUDGET_S / batch1_s if batch1_s > 0 else NATIVE_MAX_REQUESTS
    return int(min(NATIVE_MAX_REQUESTS, max(NATIVE_MIN_REQUESTS, fits)))


def route_natively(admitted: int, batch1_s: float, native_ready: bool) -> bool:
    """The turn's admitted lanes go through the native lone step (``native_ready``: the
    policy has one and its runner runs natively now) rather than one batched pass."""
    return native_ready and admitted <= native_limit(batch1_s)


# ------------------------------------------------------------ order
def lone_order(lanes: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lone lanes in serving order as int64, grouped lanes) of the admitted ``idx``: lone
    requests (group 0, or a group of one such as the C client's STEP_BATCH) in scan order
    but every END first (its slot goes back before a START takes one); members of a group
    of more than one go to the batch path, answered in one pass."""
    if len(idx) <= 1:
        return idx.astype(np.int64), idx[:0]
    grouped = (lanes["group"][idx] != 0) & (lanes["group_size"][idx] > 1)
    order, left = idx[~grouped].astype(np.int64), idx[grouped]
    later = lanes["op"][order] != OP_END
    if not later.all():
        order = order[np.argsort(later, kind="stable")]
    return order, left


def steps_to_boundary(sample_steps: int, link_steps: int, cutting: bool) -> int:
    """Train steps the policy takes before its next sample cut (a native run stops there,
    as a turn per request would); ``cutting``: the link is connected and not held (no cut
    can come otherwise: MAX_RECORDS, one native call's records)."""
    return max(1, sample_steps - link_steps) if cutting else MAX_RECORDS


def after_cut(order: np.ndarray, pos: int, grouped: np.ndarray) -> np.ndarray:
    """The lanes a sample cut after ``order[:pos]`` leaves for later turns: the rest of the
    lone order and every group (none is answered with the weights of the cut sample)."""
    return np.concatenate([order[pos:], grouped.astype(np.int64)])
