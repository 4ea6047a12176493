"""The checkpointer role's core, without processes: one snapshot in flight at a time.

The learner serialises each SnapshotRequest into the one snapshot area, so two in flight
(a SIGUSR1 just after the timer's) overwrote the first's snapshot before it was saved and
that checkpoint failed. Requests that come while one is in flight wait, and the next
checkpoint answers them all."""
from __future__ import annotations

from types import SimpleNamespace

from rlinkd.daemon import messages as m
from rlinkd.daemon.checkpoint import process, store
from rlinkd.daemon.config import load_config


class Ctx:
    def __init__(self) -> None:
        self.sent: list[tuple[str, object]] = []

    def send(self, target: str, msg: object) -> None:
        self.sent.append((target, msg))

    def take(self, kind: type) -> list:
        got = [msg for _, msg in self.sent if isinstance(msg, kind)]
        self.sent = [(t, msg) for t, msg in self.sent if not isinstance(msg, kind)]
        return got


def checkpointer(tmp_path) -> tuple[process.Checkpointer, Ctx]:
    cfg = load_config(overrides=[("daemon", "state_dir", str(tmp_path))])
    # the collector's counters now: newer than any snapshot's (they must not be recorded)
    topo = SimpleNamespace(cfg=cfg, trainable=lambda: [], read_counters=lambda: {"env_steps": 9999})
    ctx = Ctx()
    return process.Checkpointer(topo, ctx), ctx  # type: ignore[arg-type]


def ready(request_id: int, ok: bool = True) -> m.SnapshotReady:
    return m.SnapshotReady(request_id, {}, {"default": 5}, ok, "" if ok else "disk on fire",
                           {"env_steps": 7, "episodes": 2})


def test_requests_while_a_snapshot_is_in_flight_wait_and_share_the_next_checkpoint(tmp_path):
    cp, ctx = checkpointer(tmp_path)
    cp.on_request(m.CheckpointRequest(1, "timer"))
    cp.on_request(m.CheckpointRequest(2, "SIGUSR1"))
    cp.on_request(m.CheckpointRequest(3, "SIGUSR1"))
    assert [r.request_id for r in ctx.take(m.SnapshotRequest)] == [1]    # one at a time
    cp.on_snapshot(ready(1))
    done = ctx.take(m.CheckpointDone)
    assert [(d.request_id, d.ok) for d in done] == [(1, True)]
    assert [r.request_id for r in ctx.take(m.SnapshotRequest)] == [2]    # 2 and 3 together
    cp.on_snapshot(ready(1))                                              # (stale: ignored)
    assert ctx.take(m.CheckpointDone) == []
    cp.on_snapshot(ready(2))
    done = ctx.take(m.CheckpointDone)
    assert [(d.request_id, d.ok) for d in done] == [(2, True), (3, True)]
    assert done[0].path == done[1].path != ""
    newest = store.latest_valid(store.checkpoints_dir(tmp_path))
    assert newest is not None and str(newest.path) == done[0].path
    assert newest.manifest["reason"] == "SIGUSR1" and len(store.list_checkpoints(newest.path.parent)) == 2


def test_a_failed_or_unanswered_snapshot_fails_its_requests_and_the_next_go_on(tmp_path, monkeypatch):
    cp, ctx = checkpointer(tmp_path)
    cp.on_request(m.CheckpointRequest(1, "timer"))
    cp.on_request(m.CheckpointRequest(2, "SIGUSR1"))
    ctx.take(m.SnapshotRequest)
    cp.on_snapshot(ready(1, ok=False))
    failed = ctx.take(m.CheckpointDone)
    assert [(d.request_id, d.ok) for d in failed] == [(1, False)] and "disk on fire" in failed[0].error
    assert [r.request_id for r in ctx.take(m.SnapshotRequest)] == [2]
    cp.on_request(m.CheckpointRequest(3, "shutdown"))
    clock = process.time.monotonic() + process.SNAPSHOT_TIMEOUT_S + 1
    monkeypatch.setattr(process.time, "monotonic", lambda: clock)
    cp.expire()                                                           # the learner never answered 2
    assert [(d.request_id, d.ok) for d in ctx.take(m.CheckpointDone)] == [(2, False)]
    assert [r.request_id for r in ctx.take(m.SnapshotRequest)] == [3]


def test_a_checkpoint_records_the_counters_of_its_snapshot_not_newer_ones(tmp_path):
    """The collector goes on counting between the learner's snapshot and the write: the
    manifest holds the counters taken with the weights, so a resume continues from them."""
    cp, ctx = checkpointer(tmp_path)
    cp.on_request(m.CheckpointRequest(1, "timer"))
    cp.on_snapshot(ready(1))
    done = ctx.take(m.CheckpointDone)
    assert [d.ok for d in done] == [True]
    ckpt = store.verify(store.checkpoints_dir(tmp_path) / "ckpt-000001")
    assert ckpt.counters == {"env_steps": 7, "episodes": 2} and ckpt.weights_seq_no == 5
