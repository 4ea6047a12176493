"""Tier 1: the TensorBoard scalars of a status report (daemon.metrics): the default policy
under the plain tags, every other policy under ``policy/<name>/``."""
from __future__ import annotations

import dataclasses

from rlinkd.daemon import messages as m
from rlinkd.daemon.metrics import scalars_from_status

STATE = m.LearnerState(lr=0.001, ent_coef=0.0, updates=3, trained_steps=300, rejected_batches=0)


def status(**policies: m.PolicyDigest) -> m.CollectorStatus:
    return m.CollectorStatus(env_steps=1000, episodes=10, env_steps_per_s=500.0,
                             episode_return_mean=20.0, episode_len_mean=20.0, weights_seq_no=3,
                             clients=2, dropped_episodes=0, learner=STATE, update=None,
                             policies=policies)


def test_a_single_policy_daemon_writes_only_the_plain_tags():
    tags = scalars_from_status(status())
    assert tags["episode/return_mean"] == 20.0 and tags["learner/lr"] == 0.001
    assert not any(t.startswith("policy/") for t in tags)


def test_every_other_policy_gets_its_own_tags():
    red = m.PolicyDigest(weights_seq_no=9, episodes=4, episode_return_mean=-1.5,
                         learner=m.LearnerState(lr=0.01, ent_coef=0.0, updates=9,
                                                trained_steps=900, rejected_batches=0),
                         update=None)
    frozen = m.PolicyDigest(weights_seq_no=0, episodes=2, episode_return_mean=None,
                            learner=None, update=None)
    tags = scalars_from_status(status(red=red, opponent=frozen))
    assert tags["policy/red/episode/return_mean"] == -1.5
    assert tags["policy/red/weights_seq_no"] == 9.0 and tags["policy/red/learner/lr"] == 0.01
    assert tags["policy/opponent/weights_seq_no"] == 0.0
    assert "policy/opponent/episode/return_mean" not in tags  # None is left out
    assert tags["learner/lr"] == 0.001                        # the default's stay plain


def test_the_device_trained_on_and_its_timings_are_scalars():
    timed = m.LearnerState(lr=0.01, ent_coef=0.0, updates=9, trained_steps=900, rejected_batches=0,
                           device="cuda:1", device_choice="measured",
                           device_step_s={"cpu": 0.004, "cuda:1": 0.001})
    red = m.PolicyDigest(weights_seq_no=9, episodes=4, episode_return_mean=-1.5, learner=timed,
                         update=None)
    cpu = m.LearnerState(lr=0.001, ent_coef=0.0, updates=3, trained_steps=300, rejected_batches=0,
                         device="cpu", device_choice="only_cpu")
    tags = scalars_from_status(dataclasses.replace(status(red=red), learner=cpu))
    assert tags["learner/cuda_index"] == -1.0 and "learner/sgd_step_s/cpu" not in tags
    assert tags["policy/red/learner/cuda_index"] == 1.0
    assert tags["policy/red/learner/sgd_step_s/cuda1"] == 0.001
    assert tags["policy/red/learner/sgd_step_s/cpu"] == 0.004


def test_a_rank_of_a_job_writes_the_cluster_tags():
    rank = dataclasses.replace(STATE, cluster=m.ClusterState(2, 0, (0, 1), 1, 0.05, (256, 128), "ab"))
    tags = scalars_from_status(dataclasses.replace(status(), learner=rank))
    assert (tags["cluster/world_size"], tags["cluster/rank"], tags["cluster/members"]) == (2.0, 0.0, 2.0)
    assert tags["cluster/collective_time_s"] == 0.05 and tags["cluster/generation"] == 1.0
    assert (tags["cluster/rows/0"], tags["cluster/rows/1"]) == (256.0, 128.0)
    assert not any(t.startswith("cluster/") for t in scalars_from_status(status()))
