"""DQN and SAC as a job of two ranks on gloo over loopback (two spawned processes): after the
rounds below both ranks hold bit-identical networks (online, target, critics, log alpha),
optimizer state and counters, and these equal ONE learner's (within TOLERANCE) stepping on
the concatenation of the ranks' samples. Rank 1 starts with an empty buffer (0 rows: the job
runs rank 0's due steps without stalling), the ranks sample at different batch sizes, the
step count is the most any rank has due up to the next publication, and rank 1's lr differs
(rank 0's governs the job)."""
from __future__ import annotations

import multiprocessing
from dataclasses import replace

import numpy as np
import torch

from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import Box, Discrete
from rlinkd.daemon.cluster.steps import replay_steps
from rlinkd.daemon.config import ClusterConfig, DQNConfig, SACConfig
from rlinkd.daemon.learner.dqn_learner import DQNLearner
from rlinkd.daemon.learner.sac_learner import SACLearner
from rlinkd.shm.records import StepLayout
from rlinkd.shm.replay import ReplayLayout
from tests.helpers import run_ranks

SEEDS = (5, 9)
TOLERANCE = 1e-5
ROUNDS = [((3, 32, 40), (0, 0, 0)),      # per round and rank: (steps due, rows per step, received)
          ((2, 32, 30), (4, 48, 60)),    # 2 of rank 1's 4: the publication after 5 steps caps it
          ((0, 32, 10), (2, 48, 20)),    # rank 0 has none due: it samples for rank 1's steps
          ((0, 0, 5), (0, 48, 0))]       # none due anywhere: no step
ALGOS = {
    "dqn": (PolicySpec(Box((4,), low=-5.0, high=5.0), Discrete(3), hidden_sizes=(16,), activation="relu"),
            DQNConfig(lr=1e-2, lr_end=1e-3, lr_decay_steps=400, target_update_interval_updates=2,
                      publish_interval_updates=5), ReplayLayout(StepLayout.flat(4, 1, 3))),
    "sac": (PolicySpec(Box((4,), low=-1.0, high=1.0), Box((2,), low=-2.0, high=2.0), hidden_sizes=(16,),
                       activation="relu", box_dist="squashed_gaussian"),
            SACConfig(lr=3e-3, publish_interval_updates=5, max_grad_norm=1.0),
            ReplayLayout(StepLayout.flat(4, 2, 4)))}


def sample_rows(algo: str, n: int, seed: int) -> np.ndarray:
    layout = ALGOS[algo][2]
    rng = np.random.default_rng(seed)
    out = layout.empty(n)
    out["obs"]["obs"] = rng.uniform(-1, 1, (n, 4))
    out["next_obs"]["obs"] = rng.uniform(-1, 1, (n, 4))
    if algo == "dqn":
        out["action"][:, 0] = rng.integers(0, 3, n)
    else:
        out["action"] = rng.uniform(-2, 2, (n, 2))
    out["reward"], out["discount"] = rng.uniform(0, 1, n), np.where(rng.random(n) < 0.2, 0.0, 0.99)
    return out


def make_core(algo: str, seed: int, hp=None, job=None):
    from rlinkd.daemon.learner.replay_job_core import JobDQNLearner, JobSACLearner
    spec, default_hp, _ = ALGOS[algo]
    hp = hp or default_hp
    if job is not None:
        cls = JobDQNLearner if algo == "dqn" else JobSACLearner
        return cls(spec, hp, job, device="cpu", seed=seed)
    return (DQNLearner if algo == "dqn" else SACLearner)(spec, hp, device="cpu", seed=seed, graphs=False)


def state_of(core) -> dict[str, np.ndarray]:
    modules = [core.model, core.target] if hasattr(core, "target") else [core.model, *core.critics, *core.targets]
    opts = [core.optimizer] if hasattr(core, "optimizer") else core._optimizers()
    out = {f"module{i}": np.concatenate([t.detach().numpy().ravel() for t in m.state_dict().values()])
           for i, m in enumerate(modules)}
    out.update({f"opt{i}_{k}": getattr(o, k).numpy().copy() for i, o in enumerate(opts) for k in ("m", "v")})
    out["counters"] = np.array([core.updates, core.trained_steps, core.env_steps])
    return out


def rank_main(rank: int, port: int, results: multiprocessing.Queue) -> None:
    """Both algorithms' rounds in one job (one process pair: the spawn costs most)."""
    from rlinkd.daemon.cluster.job import Job
    torch.set_num_threads(1)
    cluster = ClusterConfig(world_size=2, rank=rank, master=f"127.0.0.1:{port}", collective_timeout_s=30.0)
    job = Job.connect(cluster, torch.device("cpu"))
    job.enter(window_s=30.0, beat=lambda: None)
    out = {}
    for algo, (_, hp, _) in ALGOS.items():
        core = make_core(algo, SEEDS[rank], hp if rank == 0 else replace(hp, lr=1e-4), job)
        core.take_job_state()
        drawn, steps = iter(range(1000)), []
        for plan in ROUNDS:
            due, batch_size, received = plan[rank]
            stats = core.round(due, batch_size, received, lambda a=algo, bs=batch_size, d=drawn: sample_rows(
                a, bs, 1000 * rank + next(d)), lambda: None)
            steps.append(len(stats))
        out[algo] = {**state_of(core), "steps": np.array(steps)}
    results.put((rank, out))
    job.close()


def concat(parts: list[dict]) -> dict:
    return {k: concat([p[k] for p in parts]) if isinstance(parts[0][k], dict) else torch.cat([p[k] for p in parts])
            for k in parts[0]}


def one_learner_on_the_union(algo: str) -> dict[str, np.ndarray]:
    """The oracle: one learner stepping on the concatenated samples of both ranks (SAC: with
    each rank's own noise draws)."""
    oracle = make_core(algo, SEEDS[0])
    noise_of = [make_core(algo, seed) for seed in SEEDS]  # (each rank's noise generator)
    drawn, steps_run = [iter(range(1000)), iter(range(1000))], []
    for plan in ROUNDS:
        oracle.env_steps += sum(p[2] for p in plan)
        interval = oracle.hp.publish_interval_updates
        steps = replay_steps([p[0] for p in plan], [p[1] for p in plan], interval - oracle.updates % interval)
        steps_run.append(steps)
        for _ in range(steps):
            samples = [(r, sample_rows(algo, p[1], 1000 * r + next(drawn[r])))
                       for r, p in enumerate(plan) if p[1]]
            if algo == "dqn":
                oracle.train_step(np.concatenate([s for _, s in samples]))
            else:
                data = concat([noise_of[r]._to_tensors(s) for r, s in samples])
                oracle._sgd_step(data, oracle._no_idx)
                oracle._count_step(sum(len(s) for _, s in samples))
    return {**state_of(oracle), "steps": np.array(steps_run)}


def test_two_replay_ranks_step_as_one_learner_on_the_concatenated_samples():
    got = run_ranks(rank_main, 2)
    for algo in ALGOS:
        for key in got[0][algo]:
            np.testing.assert_array_equal(got[0][algo][key], got[1][algo][key], err_msg=f"{algo} {key}")
        assert got[0][algo]["steps"].tolist() == [3, 2, 2, 0]
        assert got[0][algo]["counters"].tolist() == [7, 3 * 32 + 4 * (32 + 48), 165]
        expected = one_learner_on_the_union(algo)
        for key, value in expected.items():
            np.testing.assert_allclose(got[0][algo][key], value, rtol=TOLERANCE, atol=TOLERANCE,
                                       err_msg=f"{algo} {key}")
