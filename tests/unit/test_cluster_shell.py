"""job_shell.JobShell's rounds, with stand-in policies and job (no process group): every
round runs every policy's part in name order; a rank with no work waits for peer_wait_s
before entering; a collective that fails releases the policies not yet run and re-forms."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from rlinkd.daemon.config import ClusterConfig
from rlinkd.daemon.learner.job_shell import JobShell


class FakePolicy:
    def __init__(self, name: str, log: list, work: bool = False, fails: bool = False) -> None:
        self.name, self.log, self.work, self.fails = name, log, work, fails

    def round_entry(self):
        return f"{self.name}-entry" if self.work else None

    @staticmethod
    def round_wanted(entry) -> bool:
        return entry is not None

    def run_round(self, entry) -> bool:
        if self.fails:
            raise RuntimeError("peer gone")
        self.log.append(("ran", self.name, entry))
        return entry is not None

    def release_untrained(self, entry) -> None:
        self.log.append(("released", self.name, entry))

    def between_rounds(self) -> None:
        self.log.append(("idle", self.name))


def shell_of(*policies: FakePolicy, peer_wait_s: float = 60.0) -> JobShell:
    shell = JobShell.__new__(JobShell)
    shell.cluster = ClusterConfig(world_size=2, rank=1, peer_wait_s=peer_wait_s)
    shell.ctx = SimpleNamespace(stop=threading.Event())
    shell.job = SimpleNamespace(reform_wanted=False, reform_agreed=False)
    shell.policies = {p.name: p for p in policies}
    shell.detached, shell.next_round = False, 0.0
    shell.reforms = []
    shell._reform = shell.reforms.append
    return shell


def test_a_round_runs_every_policy_in_name_order_with_or_without_rows():
    log: list = []
    shell = shell_of(FakePolicy("red", log), FakePolicy("default", log), FakePolicy("blue", log, work=True))
    assert shell.train_one()
    assert log == [("ran", "blue", "blue-entry"), ("ran", "default", None), ("ran", "red", None)]


def test_without_work_a_rank_enters_only_after_peer_wait():
    log: list = []
    shell = shell_of(FakePolicy("default", log), peer_wait_s=60.0)
    shell.train_one()                      # the first round: at once
    log.clear()
    assert not shell.train_one()           # then nothing to do within peer_wait_s
    assert log == [("idle", "default")]
    shell.next_round = time.monotonic() - 1
    shell.train_one()
    assert log[-1] == ("ran", "default", None)


def test_a_failed_collective_releases_the_rest_untrained_and_reforms():
    log: list = []
    shell = shell_of(FakePolicy("a", log, work=True), FakePolicy("b", log, work=True, fails=True),
                     FakePolicy("c", log, work=True))
    assert shell.train_one()
    assert log == [("ran", "a", "a-entry"), ("released", "b", "b-entry"), ("released", "c", "c-entry")]
    assert len(shell.reforms) == 1 and "peer gone" in shell.reforms[0]


def test_rank_0_forms_the_next_generation_when_an_admitted_rank_never_comes():
    """Rank 1 asked to join, then gave up (or restarted): rank 0 admits its stale wish, that
    generation's group cannot form within the timeout, and rank 0 forms the next one from
    the ranks asking then (here none) instead of failing its learner."""
    import torch

    from rlinkd.daemon.cluster.job import Job
    from rlinkd.daemon.cluster.membership import Membership
    from tests.helpers import free_port
    port = free_port()
    cluster = ClusterConfig(world_size=2, rank=0, master=f"127.0.0.1:{port}",
                            collective_timeout_s=1.5, reform_window_s=0.2)
    job = Job.connect(cluster, torch.device("cpu"))
    try:
        stale = Membership("127.0.0.1", port, 1, 2, 1.5)
        stale.ask(stale.current() + 1)
        shell = JobShell.__new__(JobShell)
        shell.cluster, shell.job, shell.policies, shell.detached = cluster, job, {}, False
        shell.ctx = SimpleNamespace(stop=threading.Event(), heartbeat=lambda: None)
        shell._check_same_job = shell._check_device_kinds = lambda: None
        shell._reform("a newcomer asks to join")
        assert job.members == [0] and job.generation == 2
    finally:
        job.close()


def test_a_rank_asking_to_join_beats_before_each_store_call():
    """After a collective failed on its timeout, a store call to a vanished rank 0 blocks up
    to the timeout again: a beat must come before it, or the supervisor takes the learner
    for hung (two timeouts without a heartbeat exceed daemon.heartbeat_timeout_s)."""
    from rlinkd.daemon.cluster.job import Job
    events: list[str] = []

    class VanishedStore:
        def current(self):
            events.append("store")
            raise RuntimeError("rank 0's store timed out")

    job = Job.__new__(Job)
    job.cluster = ClusterConfig(world_size=2, rank=1, master="127.0.0.1:1", collective_timeout_s=5.0)
    job.rank, job.membership = 1, VanishedStore()
    with pytest.raises(RuntimeError, match="timed out"):
        job._ask_until_member(lambda: events.append("beat"))
    assert events[:2] == ["beat", "store"]


@pytest.mark.parametrize("backend, preset, want", [("nccl", None, "2"), ("nccl", "1", "1"), ("gloo", None, None)])
def test_an_nccl_group_raises_on_a_timeout_instead_of_aborting(monkeypatch, backend, preset, want):
    """torch's default NCCL error mode kills the process on a collective's timeout: a lost
    member would crash every survivor instead of making them re-form. Unless the
    environment chose a mode, rlinkd asks for 2 (raise in the caller)."""
    import os

    from rlinkd.daemon.cluster import job as job_module
    from rlinkd.daemon.cluster.job import NCCL_ERRORS_VAR, Job
    monkeypatch.setenv(NCCL_ERRORS_VAR, preset or "")  # (restored after the test either way)
    if preset is None:
        monkeypatch.delenv(NCCL_ERRORS_VAR)
    monkeypatch.setattr(job_module.dist, "init_process_group", lambda *a, **kw: None)
    monkeypatch.setattr(job_module.dist, "PrefixStore", lambda *a: None)
    job = Job.__new__(Job)
    job.backend, job.rank, job.membership = backend, 0, SimpleNamespace(store=None)
    job.cluster = ClusterConfig(world_size=2, rank=0, master="127.0.0.1:1")
    job.leave_group = lambda: None
    monkeypatch.delenv("TORCH_NCCL_BLOCKING_WAIT", raising=False)
    job._form_group(1, [0, 1])
    assert os.environ.get(NCCL_ERRORS_VAR) == want
    assert os.environ.get("TORCH_NCCL_BLOCKING_WAIT") == (None if backend == "gloo" else "1")
    os.environ.pop("TORCH_NCCL_BLOCKING_WAIT", None)
