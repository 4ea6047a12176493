"""The learner's process loop serves control messages between batches, even when the
connector always has the next batch ready (a snapshot request must not starve)."""
from __future__ import annotations

import threading
from types import SimpleNamespace

from rlinkd.daemon import messages as m
from rlinkd.daemon.config import load_config
from rlinkd.daemon.learner import process as learner_process


class FakeInbox:
    def __init__(self) -> None:
        self.queue: list = []
        self.waits: list[float] = []

    def recv(self, timeout: float):
        self.waits.append(timeout)
        return self.queue.pop(0) if self.queue else None

    def drain(self):
        out, self.queue = self.queue, []
        return out


class FakeCtx:
    def __init__(self) -> None:
        self.stop, self.inbox = threading.Event(), FakeInbox()

    def heartbeat(self) -> None:
        pass


class AlwaysBusyShell:
    """Every call finds a ready batch; a snapshot request arrives during the first one."""

    def __init__(self, topo, ctx) -> None:
        self.ctx, self.trained, self.handled_after = ctx, 0, []

    def boot(self) -> None:
        pass

    def train_one(self) -> bool:
        self.trained += 1
        if self.trained == 1:
            self.ctx.inbox.queue.append(m.SnapshotRequest(request_id=1))
        if self.trained == 5:
            self.ctx.stop.set()
        return True

    def router(self):
        return lambda msg: self.handled_after.append(self.trained)

    seq_no = 0
    off_policy = False


def test_a_message_is_handled_right_after_the_batch_in_training(monkeypatch):
    shells = []
    monkeypatch.setattr(learner_process, "LearnerShell",
                        lambda topo, ctx: shells.append(AlwaysBusyShell(topo, ctx)) or shells[-1])
    ctx = FakeCtx()
    learner_process.run(SimpleNamespace(cfg=load_config(resolve_dirs=False)), ctx)
    assert shells[0].handled_after == [1]  # not after every ready batch has been trained
    assert ctx.inbox.waits[0] == learner_process.IDLE_WAIT_S and set(ctx.inbox.waits[1:]) == {0}


class AlwaysReadyPolicy:
    """A PolicyLearner stand-in that always has a ready batch."""

    def __init__(self, name: str, trained: list) -> None:
        self.name, self.trained = name, trained

    def train_ready(self) -> bool:
        self.trained.append(self.name)
        return True


def test_policies_take_turns_one_batch_each_when_all_always_have_data():
    trained: list[str] = []
    shell = learner_process.LearnerShell.__new__(learner_process.LearnerShell)
    shell.ctx, shell._turn = FakeCtx(), 0
    shell.policies = {n: AlwaysReadyPolicy(n, trained) for n in ("default", "red", "blue")}
    for _ in range(7):
        assert shell.train_one()
    assert trained == ["default", "red", "blue", "default", "red", "blue", "default"]
