"""A job's collective cost: PPO updates of 1, 2, ... ranks on gloo over loopback.

    .venv/bin/python -m bench.scenarios.cluster [--ranks 1,2] [--rows 512] [--updates 5]
                                               [--threads 1] [--out FILE]

Each rank is a process with its own ``Learner`` joined to one job (``daemon.cluster``: one
all-reduce per SGD step), training ``--rows`` rows of a synthetic CartPole batch per update
with the default [ppo] (64x64 MLP, minibatch 128, 10 epochs, target_kl off) and
``--threads`` torch threads. Per world size: the median (min-max) over ``--updates`` updates
(after one warm-up) of the update's wall time, its time inside collectives and that share,
and the job's SGD rows/s (ranks x rows x epochs / update time) with its ratio to one rank.
The ranks share this machine's cores: ranks beyond the cores measure contention, not scaling.
Results go to ``bench/results/cluster.json``.
"""
from __future__ import annotations

import argparse
import multiprocessing
import socket

import numpy as np
import torch

from bench.harness.common import fmt_mr, median_range, print_table, write_result
from rlinkd.client_lib.protocol.spaces import Box, Discrete
from rlinkd.daemon.config import ClusterConfig, PPOConfig
from rlinkd.daemon.learner.learner import Learner
from rlinkd.daemon.policies import make_policy_spec

HP = PPOConfig(target_kl=0.0)


def synthetic_batch(rows: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"obs": rng.uniform(-1, 1, (rows, 4)).astype(np.float32),
            "actions": rng.integers(0, 2, rows).astype(np.float32),
            "logp": np.full(rows, -np.log(2), np.float32),
            **{k: rng.normal(size=rows).astype(np.float32)
               for k in ("advantages", "value_targets", "values")}}


def rank_main(rank: int, world: int, port: int, args: argparse.Namespace, out) -> None:
    torch.set_num_threads(args.threads)
    spec = make_policy_spec(HP, Box([4], low=-5.0, high=5.0), Discrete(2), "")
    job = None
    if world > 1:
        from rlinkd.daemon.cluster.job import Job
        job = Job.connect(ClusterConfig(world_size=world, rank=rank, master=f"127.0.0.1:{port}"),
                          torch.device("cpu"))
        job.enter(60.0, lambda: None)
    if job is None:
        learner = Learner(spec, HP, device="cpu", seed=rank, torch_threads=args.threads)
    else:
        from rlinkd.daemon.learner.job_core import JobRankLearner
        learner = JobRankLearner(spec, HP, job, device="cpu", seed=rank, torch_threads=args.threads)
        learner.take_job_state()
    times = []
    for i in range(args.updates + 1):
        stats = learner.update(synthetic_batch(args.rows, 10 * i + rank))
        if i:
            times.append((stats["update_time_s"], stats.get("collective_time_s", 0.0)))
    out.put((rank, times, all_reduce_s(job, learner.optimizer.grad.numel())))
    if job is not None:
        job.close()


def all_reduce_s(job, params: int, repeats: int = 200) -> list[float]:
    """Seconds of one all-reduce of a step's buffer (params + diagnostics + 2), back to back:
    the transfer alone, without waiting for a slower rank's SGD step."""
    if job is None:
        return []
    import time

    import torch.distributed as dist
    buffer = torch.zeros(params + 8 + 2)
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        dist.all_reduce(buffer)
        out.append(time.perf_counter() - start)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(world: int, args: argparse.Namespace) -> dict:
    ctx = multiprocessing.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=rank_main, args=(r, world, port, args, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = {rank: (times, ops) for rank, times, ops in (out.get(timeout=600) for _ in procs)}
    for p in procs:
        p.join(60)
    times, ops = results[0]
    update = [t for t, _ in times]
    collective = [c for _, c in times]
    rows_per_s = [world * args.rows * HP.num_epochs / t for t in update]
    return {"world_size": world, "update_s": median_range(update, 4),
            "collective_s": median_range(collective, 4),
            "collective_share": median_range([c / t for t, c in times], 3),
            "all_reduce_s": median_range(ops, 6),
            "sgd_rows_per_s": median_range(rows_per_s, 0)}


def markdown(res: dict) -> str:
    base = res["worlds"][0]["sgd_rows_per_s"]["median"]
    rows = [(w["world_size"], fmt_mr(w["update_s"], 1, 1000), fmt_mr(w["collective_s"], 1, 1000),
             fmt_mr(w["collective_share"], 0, 100), fmt_mr(w["sgd_rows_per_s"]),
             f"{w['sgd_rows_per_s']['median'] / base:.2f}x",
             fmt_mr(w["all_reduce_s"], 0, 1e6) if w["all_reduce_s"]["n"] else "–")
            for w in res["worlds"]]
    return print_table(f"PPO update of {res['rows']} rows per rank, gloo on loopback, "
                       f"{res['threads']} torch thread(s) per rank",
                       ("ranks", "update ms", "in collectives ms", "collective share %",
                        "job SGD rows/s", "vs 1 rank", "one step all-reduce µs"), rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="1,2", help="world sizes to measure, comma-separated")
    ap.add_argument("--rows", type=int, default=512, help="rows per rank per update")
    ap.add_argument("--updates", type=int, default=5, help="timed updates per world size")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--out", default=None, help="result file (default bench/results/cluster.json)")
    args = ap.parse_args()
    res = {"rows": args.rows, "threads": args.threads,
           "worlds": [run_world(int(w), args) for w in args.ranks.split(",")]}
    res["summary_markdown"] = markdown(res)
    write_result("cluster", res, args.out)


if __name__ == "__main__":
    main()
