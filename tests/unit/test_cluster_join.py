"""Joining a job and counting a round, with stand-in jobs (no process group): a newly formed
group takes the state of the member with the newest weights and, on a tie, the one that has
run the most gradient steps; a replay round that fails after its exchange does not count the
transitions it exchanged again."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlinkd.daemon.learner.job_member import JobMember, newest_member
from tests.unit.test_cluster_replay import make_core


@pytest.mark.parametrize("seq_nos, updates, source", [
    ([7, 9], [500, 0], 1),    # the newest weights win, whatever the step counts
    ([7, 7], [0, 120], 1),    # a tie: the member that kept its optimizer and targets
    ([7, 7], [120, 120], 0),  # a full tie: the first
    ([3, 8, 8], [9, 4, 6], 2),
])
def test_the_newest_member_is_the_newest_weights_then_the_most_steps(seq_nos, updates, source):
    assert newest_member(seq_nos, updates) == source


class GatherJob:
    """Answers each gather with the next list of ``answers``."""

    def __init__(self, *answers: list[int]) -> None:
        self.answers, self.members = list(answers), [0, 1]

    def gather(self, value: int) -> list[int]:
        return self.answers.pop(0)


class Core:
    updates, taken = 0, None

    @staticmethod
    def flat_weights():
        import numpy as np
        return np.zeros(3, np.float32)

    def take_job_state(self, source: int) -> None:
        self.taken = source


class Member(JobMember):
    def __init__(self, job: GatherJob) -> None:
        self.job, self.seq_no, self.core, self.announced, self.digest = job, 7, Core(), False, ""

    def _job_core(self) -> Core:  # type: ignore[override]
        return self.core

    def _announce(self) -> None:  # type: ignore[override]
        self.announced = True


def test_a_restarted_rank_does_not_overwrite_an_intact_copy_on_a_tie():
    """Rank 0's learner restarted (its weights from the board, nothing else): rank 1's
    state, at the same sequence number but 120 steps run, is the one the job takes."""
    member = Member(GatherJob([7, 7], [0, 120], [5 << 1, 5 << 1]))   # (the same weights: the board's)
    assert member.join_job() == 1
    assert member.core.taken == 1 and member.seq_no == 7 and member.announced


@pytest.mark.parametrize("seq_nos, prints, source, seq_no", [
    ([0, 0], [11, 22], 0, 1),     # first formation: each rank's own random seq-0 weights
    ([0, 0, 0], [11, 11, 11], 0, 0),  # the same weights everywhere: nothing to replace
    ([7, 9], [11, 22], 1, 9),     # only the newest published under 9
    ([9, 9, 4], [11, 11, 33], 0, 9),  # the older member's number is below: its readers update
    ([9, 9], [11, 22], 1, 10),
])
def test_a_number_another_member_published_other_weights_under_is_not_reused(seq_nos, prints, source,
                                                                             seq_no):
    from rlinkd.daemon.learner.job_member import joined_seq_no
    assert joined_seq_no(seq_nos, prints, source) == seq_no


def test_weights_changed_since_their_publication_take_a_new_number():
    """A replay round cut after some steps were applied: the survivor's weights are not the
    ones it published under its number any more."""
    from rlinkd.daemon.learner.job_member import joined_seq_no
    assert joined_seq_no([9], [11], 0, changed=True) == 10
    assert joined_seq_no([9], [11], 0, changed=False) == 9
    member = Member(GatherJob([9, 9], [5, 5], [22 << 1 | 1, 22 << 1]))
    member.digest = "published"  # (not the current weights' digest: they changed)
    member.join_job()
    assert member.seq_no == 10


class ExchangeJob:
    """One member's stand-in job: every exchange answers both members' counts."""

    leader_hparams = (1e-2, 0.0)
    collective_s = 0.0

    def exchange(self, mine, hparams=(0.0, 0.0)):
        return [list(mine), [0.0, 0.0, 25.0]]


def test_a_round_that_fails_after_its_exchange_counted_its_transitions_once():
    core = make_core("dqn", 5, job=ExchangeJob())
    counted: list[int] = []

    def fail() -> None:
        raise RuntimeError("peer gone")
    with pytest.raises(RuntimeError):
        core.round(2, 8, 40, fail, lambda: None, lambda: counted.append(core.env_steps))
    assert counted == [65] and core.env_steps == 65  # (40 here + 25 there, counted before the step)


def test_a_job_whose_policies_learn_on_different_device_kinds_is_refused():
    """A second trainable policy that ``learner.device = auto`` placed on another kind of
    device than the job's: its gradient could not be averaged with the job's collectives."""
    import torch

    from rlinkd.daemon.errors import ConfigError
    from rlinkd.daemon.learner.job_shell import JobShell
    closed: list[bool] = []
    shell = JobShell.__new__(JobShell)
    shell.job = SimpleNamespace(device=torch.device("cpu"), close=lambda: closed.append(True))
    shell.policies = {name: SimpleNamespace(placement=SimpleNamespace(device=device))
                      for name, device in (("default", "cpu"), ("red", "cuda:0"))}
    with pytest.raises(ConfigError, match=r"learner\.device: .* kind \(cpu\); here they learn on cpu, cuda"):
        shell._check_device_kinds()
    assert closed == [True]


@pytest.mark.parametrize("rank, refused", [(0, False), (2, False), (1, True)])
def test_a_member_whose_config_differs_from_rank_0s_leaves_and_the_others_form_again(rank, refused):
    """Rank 0's config is the job's: the member that differs exits 78 (ConfigError naming
    the ranks it differs from), the others are told to form the group again without it."""
    from rlinkd.daemon.config import ClusterConfig
    from rlinkd.daemon.errors import ConfigError
    from rlinkd.daemon.learner.job_shell import JobShell
    job = GatherJob([11, 22, 11])
    job.members, job.close = [0, 1, 2], lambda: None
    shell = JobShell.__new__(JobShell)
    shell.cluster, shell.job, shell.policies = ClusterConfig(world_size=3, rank=rank), job, {}
    if refused:
        with pytest.raises(ConfigError, match=r"cluster\.world_size: rank 1 and rank\(s\) \[0, 2\] train different"):
            shell._check_same_job()
    else:
        assert shell._check_same_job() == [1]
    assert JobShell._check_same_job(SimpleNamespace(job=GatherJob([5, 5]), _ordered=lambda: [])) == []
