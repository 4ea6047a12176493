"""A job of two learners on gloo over loopback (two spawned processes): after N updates both
ranks hold bit-identical weights, optimizer state and normaliser statistics, and these equal
ONE learner's (within 1e-5) trained on the concatenated batches with the union minibatches
``daemon.cluster.steps`` describes. The batches differ in size per rank, one update has a
rank without rows, and rank 1's lr and ent_coef differ (rank 0's govern the job). The same
pair of processes then trains a recurrent (LSTM) policy: minibatches of whole chunks, each
rank's gradient weighted by its real (unpadded) steps, equal to one learner on the union of
the ranks' chunks."""
from __future__ import annotations

import multiprocessing
from dataclasses import replace

import numpy as np
import torch

from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import Box, Discrete
from rlinkd.daemon.cluster.steps import job_steps
from rlinkd.daemon.config import ClusterConfig, PPOConfig
from rlinkd.daemon.learner.learner import Learner
from rlinkd.daemon.learner.minibatch import update_plan
from tests.recurrent_data import pipeline_batch, small_spec
from tests.helpers import run_ranks

SPEC = PolicySpec(Box((4,)), Discrete(2), hidden_sizes=(16, 16))
HP = PPOConfig(lr=3e-3, num_epochs=2, minibatch_size=64, normalize_observations=True)
ROWS = [(300, 40), (200, None), (100, 140)]  # per update: rank 0's rows, rank 1's (None: none)
SEEDS = (3, 11)
R_SPEC = small_spec("lstm", max_seq_len=4)
R_HP = PPOConfig(lr=3e-3, num_epochs=2, minibatch_size=16, max_seq_len=4)
R_EPISODES = [(6, 2), (3, None), (2, 5)]  # per update: rank 0's episodes, rank 1's (None: none)
TOLERANCE = 1e-5


def make_batch(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    obs = (rng.standard_normal((n, 4)) * 2 + 1).astype(np.float32)
    flat = Learner(SPEC, HP, device="cpu", seed=SEEDS[0]).flat_weights()
    dist = SPEC.actor_forward(flat, obs)
    actions = SPEC.sample_actions(dist, rng)
    return {"obs": obs, "actions": actions, "logp": SPEC.log_prob(dist, actions),
            "advantages": rng.standard_normal(n).astype(np.float32),
            "value_targets": rng.standard_normal(n).astype(np.float32),
            "values": SPEC.value_forward(flat, obs)}


def batches(rank: int) -> list[dict | None]:
    return [None if rows[rank] is None else make_batch(rows[rank], 100 * u + rank)
            for u, rows in enumerate(ROWS)]


def state_of(learner: Learner, normalized: bool = True) -> dict[str, np.ndarray]:
    out = {"weights": learner.flat_weights(), "m": learner.optimizer.m.numpy().copy(),
           "v": learner.optimizer.v.numpy().copy(),
           "counters": np.array([learner.updates, learner.trained_steps])}
    if normalized:
        norm = learner.normalizers[""]
        out.update(norm_mean=norm.mean.copy(), norm_m2=norm.m2.copy())
    return out


def rank_main(rank: int, port: int, results: multiprocessing.Queue) -> None:
    from rlinkd.daemon.cluster.job import Job
    from rlinkd.daemon.learner.job_core import JobRankLearner
    torch.set_num_threads(1)
    cluster = ClusterConfig(world_size=2, rank=rank, master=f"127.0.0.1:{port}",
                            collective_timeout_s=30.0)
    job = Job.connect(cluster, torch.device("cpu"))
    job.enter(window_s=30.0, beat=lambda: None)
    hp = HP if rank == 0 else replace(HP, lr=1e-3, ent_coef=0.01)  # rank 0's govern the job
    learner = JobRankLearner(SPEC, hp, job, device="cpu", seed=SEEDS[rank])
    learner.take_job_state()
    for batch in batches(rank):
        stats = learner.update(batch)
        assert stats["job_rows"] > 0
    recurrent = JobRankLearner(R_SPEC, R_HP, job, device="cpu", seed=SEEDS[rank])
    recurrent.take_job_state()
    for batch in recurrent_batches(rank):
        assert recurrent.update(batch)["job_rows"] > 0
    results.put((rank, {"ppo": state_of(learner), "recurrent": state_of(recurrent, normalized=False)}))
    job.close()


def recurrent_batches(rank: int) -> list[dict | None]:
    """Per update: rank 0's batch of acted LSTM episodes, rank 1's (fewer episodes, or none)."""
    flat = Learner(R_SPEC, R_HP, device="cpu", seed=SEEDS[0], graphs=False).flat_weights()
    return [None if episodes[rank] is None else
            pipeline_batch(R_SPEC, flat, episodes=episodes[rank], seed=10 * u + rank)
            for u, episodes in enumerate(R_EPISODES)]


def concat_batches(parts: list[dict]) -> dict:
    return {k: concat_batches([p[k] for p in parts]) if isinstance(parts[0][k], dict)
            else np.concatenate([p[k] for p in parts]) for k in parts[0]}


def one_recurrent_learner_on_the_union() -> dict[str, np.ndarray]:
    """The oracle: one learner stepping on the unions of the ranks' minibatches of chunks
    (the union's masked loss is the mean over the real steps of both ranks' chunks)."""
    learner = Learner(R_SPEC, R_HP, device="cpu", seed=SEEDS[0], graphs=False)
    rngs = [np.random.default_rng((seed, 1)) for seed in SEEDS]
    per_minibatch = learner._units_per_minibatch()
    for parts in zip(recurrent_batches(0), recurrent_batches(1)):
        present = [b for b in parts if b is not None]
        data = learner._to_tensors(concat_batches(present))
        plans, offset = [], 0
        for rng, b in zip(rngs, parts):
            if b is not None:
                chunks = learner._plan_units(learner._to_tensors(b))[0]
                plans.append(update_plan(rng, chunks, per_minibatch, R_HP.num_epochs) + offset)
                offset += chunks
        steps = max(p.shape[1] for p in plans)
        for epoch in range(R_HP.num_epochs):
            for k in range(steps):
                idx = np.concatenate([p[epoch, k] for p in plans if k < p.shape[1]])
                learner._sgd_step(data, torch.from_numpy(idx))
        learner.updates += 1
        learner.trained_steps += sum(len(b["actions"]) for b in present)
    return state_of(learner, normalized=False)


def one_learner_on_the_union() -> dict[str, np.ndarray]:
    """The oracle: one learner stepping on the unions of the ranks' minibatches."""
    learner = Learner(SPEC, HP, device="cpu", seed=SEEDS[0])
    rngs = [np.random.default_rng((seed, 1)) for seed in SEEDS]
    for parts in zip(batches(0), batches(1)):
        present = [b for b in parts if b is not None]
        union = {k: np.concatenate([b[k] for b in present]) for k in present[0]}
        data = learner._to_tensors(union)
        plans, offset = [], 0
        for rng, b in zip(rngs, parts):
            if b is not None:
                plans.append(update_plan(rng, len(b["obs"]), HP.minibatch_size, HP.num_epochs) + offset)
                offset += len(b["obs"])
        steps = job_steps([len(b["obs"]) for b in present], HP.minibatch_size)
        for epoch in range(HP.num_epochs):
            for k in range(steps):
                idx = np.concatenate([p[epoch, k] for p in plans if k < p.shape[1]])
                learner._sgd_step(data, torch.from_numpy(idx))
        learner._fold_into_normalizers({"": union["obs"]})
        learner.updates += 1
        learner.trained_steps += len(union["obs"])
    return state_of(learner)


def test_two_ranks_train_as_one_learner_on_the_concatenated_batches():
    got = run_ranks(rank_main, 2)
    for kind in ("ppo", "recurrent"):
        for key in got[0][kind]:
            np.testing.assert_array_equal(got[0][kind][key], got[1][kind][key], err_msg=f"{kind} {key}")
    assert got[0]["ppo"]["counters"].tolist() == [3, 300 + 40 + 200 + 100 + 140]
    for kind, expected in (("ppo", one_learner_on_the_union()),
                           ("recurrent", one_recurrent_learner_on_the_union())):
        for key, value in expected.items():
            np.testing.assert_allclose(got[0][kind][key], value, rtol=TOLERANCE, atol=TOLERANCE,
                                       err_msg=f"{kind} {key}")
