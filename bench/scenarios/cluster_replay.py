"""A job's collective cost for replay learners: DQN and SAC gradient steps of 1 and 2 ranks
on gloo over loopback.

    .venv/bin/python -m bench.scenarios.cluster_replay [--ranks 1,2] [--steps 200]
                                                       [--threads 1] [--out FILE]

Each rank is a process with its own replay core joined to one job
(``daemon.learner.replay_job_core``: every gradient step all-reduces each network's
row-weighted gradient, DQN one all-reduce, SAC three), stepping on its own synthetic replay
sample of the default batch size ([dqn] 64 rows, [sac] 256 rows, 256x256 networks) with
``--threads`` torch threads, in rounds of ``publish_interval_updates`` steps as the learner
runs them. Per algorithm and world size: the median (min-max) over the rounds (after one
warm-up round) of the time per gradient step, its time inside collectives and that share,
and the job's sampled rows/s (ranks x batch / step time). The ranks share this machine's
cores. Results go to ``bench/results/cluster_replay.json``.
"""
from __future__ import annotations

import argparse
import multiprocessing
import time

import numpy as np
import torch

from bench.harness.common import fmt_mr, median_range, print_table, write_result
from bench.scenarios.cluster import free_port
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import Box, Discrete
from rlinkd.daemon.config import ClusterConfig, DQNConfig, SACConfig
from rlinkd.shm.records import StepLayout
from rlinkd.shm.replay import ReplayLayout

ALGOS = {"dqn": (DQNConfig(), Discrete(2), 1), "sac": (SACConfig(), Box((2,), low=-1.0, high=1.0), 2)}


def sample(algo: str, n: int, rng: np.random.Generator) -> np.ndarray:
    action_size = ALGOS[algo][2]
    out = ReplayLayout(StepLayout.flat(4, action_size, 2 if algo == "dqn" else 2 * action_size)).empty(n)
    out["obs"]["obs"] = rng.uniform(-1, 1, (n, 4))
    out["next_obs"]["obs"] = rng.uniform(-1, 1, (n, 4))
    out["action"] = rng.integers(0, 2, (n, 1)) if algo == "dqn" else rng.uniform(-1, 1, (n, action_size))
    out["reward"], out["discount"] = rng.normal(size=n), np.full(n, 0.99)
    return out


def core_of(algo: str, job, rank: int, threads: int):
    from rlinkd.daemon.learner.dqn_learner import DQNLearner
    from rlinkd.daemon.learner.sac_learner import SACLearner
    hp, act, _ = ALGOS[algo]
    box_dist = "squashed_gaussian" if algo == "sac" else "gaussian"
    spec = PolicySpec(Box((4,), low=-5.0, high=5.0), act, hidden_sizes=hp.hidden_sizes,
                      activation=hp.activation, box_dist=box_dist)
    if job is None:
        cls = DQNLearner if algo == "dqn" else SACLearner
        return cls(spec, hp, device="cpu", seed=rank, torch_threads=threads, graphs=False)
    from rlinkd.daemon.learner.replay_job_core import JobDQNLearner, JobSACLearner
    core = (JobDQNLearner if algo == "dqn" else JobSACLearner)(spec, hp, job, device="cpu", seed=rank,
                                                               torch_threads=threads)
    core.take_job_state()
    return core


def timed_round(core, algo: str, job, rng: np.random.Generator) -> tuple[float, float]:
    """(seconds per step, collective seconds per step) of one round of publish_interval steps."""
    hp, steps = core.hp, core.hp.publish_interval_updates
    before, start = (job.collective_s if job else 0.0), time.perf_counter()
    if job is None:
        for _ in range(steps):
            core.train_step(sample(algo, hp.batch_size, rng))
    else:
        core.round(steps, hp.batch_size, 0, lambda: sample(algo, hp.batch_size, rng), lambda: None)
    elapsed = time.perf_counter() - start
    return elapsed / steps, ((job.collective_s if job else 0.0) - before) / steps


def rank_main(rank: int, world: int, port: int, args: argparse.Namespace, out) -> None:
    torch.set_num_threads(args.threads)
    job = None
    if world > 1:
        from rlinkd.daemon.cluster.job import Job
        job = Job.connect(ClusterConfig(world_size=world, rank=rank, master=f"127.0.0.1:{port}"),
                          torch.device("cpu"))
        job.enter(60.0, lambda: None)
    rng = np.random.default_rng(rank)
    results = {}
    for algo in ALGOS:
        core = core_of(algo, job, rank, args.threads)
        rounds = max(2, args.steps // core.hp.publish_interval_updates + 1)
        results[algo] = [timed_round(core, algo, job, rng) for _ in range(rounds)][1:]
    out.put((rank, results))
    if job is not None:
        job.close()


def run_world(world: int, args: argparse.Namespace) -> list[dict]:
    ctx = multiprocessing.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=rank_main, args=(r, world, port, args, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=900) for _ in procs)
    for p in procs:
        p.join(60)
    rows = []
    for algo, times in results[0].items():
        batch = ALGOS[algo][0].batch_size
        rows.append({"algorithm": algo, "world_size": world,
                     "step_s": median_range([t for t, _ in times], 5),
                     "collective_s": median_range([c for _, c in times], 5),
                     "collective_share": median_range([c / t for t, c in times], 3),
                     "rows_per_s": median_range([world * batch / t for t, _ in times], 0)})
    return rows


def markdown(res: dict) -> str:
    base = {r["algorithm"]: r["rows_per_s"]["median"] for r in res["runs"] if r["world_size"] == 1}
    rows = [(r["algorithm"], r["world_size"], fmt_mr(r["step_s"], 2, 1000),
             fmt_mr(r["collective_s"], 2, 1000), fmt_mr(r["collective_share"], 0, 100),
             fmt_mr(r["rows_per_s"]),
             f"{r['rows_per_s']['median'] / base[r['algorithm']]:.2f}x" if r["algorithm"] in base else "–")
            for r in sorted(res["runs"], key=lambda r: (r["algorithm"], r["world_size"]))]
    return print_table(f"DQN and SAC gradient steps, default [dqn]/[sac], gloo on loopback, "
                       f"{res['threads']} torch thread(s) per rank",
                       ("algorithm", "ranks", "step ms", "in collectives ms", "collective share %",
                        "job rows/s", "vs 1 rank"), rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="1,2", help="world sizes to measure, comma-separated")
    ap.add_argument("--steps", type=int, default=200, help="timed gradient steps per algorithm")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--out", default=None, help="result file (default bench/results/cluster_replay.json)")
    args = ap.parse_args()
    res = {"threads": args.threads,
           "runs": [row for w in args.ranks.split(",") for row in run_world(int(w), args)]}
    res["summary_markdown"] = markdown(res)
    write_result("cluster_replay", res, args.out)


if __name__ == "__main__":
    main()
