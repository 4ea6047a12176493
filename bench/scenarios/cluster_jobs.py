"""A job of whole daemons fed by CartPole clients: throughput of 1 and 2 ranks, time to solve.

    .venv/bin/python -m bench.scenarios.cluster_jobs [--seconds 30] [--clients 2]
                                                    [--solve-runs 2] [--budget-s 300] [--out FILE]

Every rank is an ``rlinkd serve`` daemon on this machine (``[cluster]``, gloo over loopback,
default config otherwise: PPO, 2048-row batches), each fed by its own CartPole clients
(``bench.scenarios.solve_client``, TCP, one process each).

(a) Throughput, 1 rank then 2 ranks in the same run, ``--clients`` clients per rank: after a
warm-up of 5 s, env steps/s (the ranks' ``env_steps`` summed) and learner rows/s (the
job's ``learner.trained_steps`` on rank 0: every rank's rows, counted once) over
``--seconds``. The ranks and their clients share this machine's cores.

(b) Time to solve, 2 ranks x 2 clients vs 1 rank x 4 clients, alternating, ``--solve-runs``
each (seed = run index): wall time from launching the daemons until the mean return of the
last 100 episodes, pooled over every client in time order, reaches 450 (``--budget-s``
without: not solved). Results go to ``bench/results/cluster_jobs.json``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time

from bench.harness.common import fmt_mr, free_port, median_range, print_table, write_result
from bench.harness.daemon import Daemon

WARMUP_S = 5.0
SOLVED_RETURN, WINDOW = 450.0, 100


def start_job(ranks: int, seed: int) -> list[Daemon]:
    """`ranks` daemons of one job (one daemon alone when `ranks` is 1), all ready."""
    master = f"127.0.0.1:{free_port()}"
    job = [] if ranks == 1 else [f"cluster.world_size={ranks}", f"cluster.master={master}"]
    daemons = [Daemon([f"learner.seed={seed}", *job, *([f"cluster.rank={r}"] if job else [])])
               for r in range(ranks)]
    for d in daemons:
        d.launch()
    for d in daemons:
        d.wait_ready(180)
    return daemons


class Clients:
    """CartPole client processes; their episodes (t, return) pooled in arrival order."""

    def __init__(self, daemons: list[Daemon], per_rank: int, seed: int) -> None:
        self.episodes: list[tuple[float, float]] = []
        self.lock = threading.Lock()
        self.procs = [subprocess.Popen(
            [sys.executable, "-m", "bench.scenarios.solve_client", "--connect",
             f"tcp://127.0.0.1:{d.port}", "--seed", str(1000 * seed + 10 * r + i)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            for r, d in enumerate(daemons) for i in range(per_rank)]
        for proc in self.procs:
            threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            event = json.loads(line)
            if "ret" in event:
                with self.lock:
                    self.episodes.append((event["t"], event["ret"]))

    def mean_last(self) -> float | None:
        with self.lock:
            last = sorted(self.episodes)[-WINDOW:]
        return sum(r for _, r in last) / len(last) if len(last) == WINDOW else None

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(30)


def counters(daemons: list[Daemon]) -> tuple[int, int]:
    """(env steps of every rank, the job's trained rows) now."""
    statuses = [d.status() for d in daemons]
    return (sum(s["env_steps"] for s in statuses),
            int((statuses[0].get("learner") or {}).get("trained_steps", 0)))


def throughput(ranks: int, per_rank: int, seconds: float) -> dict:
    daemons = start_job(ranks, seed=0)
    clients = Clients(daemons, per_rank, seed=0)
    try:
        time.sleep(WARMUP_S)
        (steps0, rows0), t0 = counters(daemons), time.monotonic()
        time.sleep(seconds)
        (steps1, rows1), t1 = counters(daemons), time.monotonic()
    finally:
        clients.stop()
        for d in daemons:
            d.stop()
    return {"ranks": ranks, "clients_per_rank": per_rank,
            "env_steps_per_s": round((steps1 - steps0) / (t1 - t0), 1),
            "learner_rows_per_s": round((rows1 - rows0) / (t1 - t0), 1)}


def solve(ranks: int, per_rank: int, seed: int, budget_s: float) -> dict:
    t0 = time.monotonic()
    daemons = start_job(ranks, seed)
    clients = Clients(daemons, per_rank, seed)
    solved_s = None
    try:
        while time.monotonic() - t0 < budget_s:
            mean = clients.mean_last()
            if mean is not None and mean >= SOLVED_RETURN:
                solved_s = round(time.monotonic() - t0, 1)
                break
            time.sleep(0.5)
        env_steps, rows = counters(daemons)
    finally:
        clients.stop()
        for d in daemons:
            d.stop()
    return {"ranks": ranks, "clients_per_rank": per_rank, "seed": seed, "solved": solved_s is not None,
            "wall_s": solved_s, "env_steps": env_steps, "trained_rows": rows}


def markdown(res: dict) -> str:
    base = res["throughput"][0]
    rows = [(t["ranks"], t["clients_per_rank"], f"{t['env_steps_per_s']:,.0f}",
             f"{t['env_steps_per_s'] / base['env_steps_per_s']:.2f}x",
             f"{t['learner_rows_per_s']:,.0f}") for t in res["throughput"]]
    table = print_table(f"(a) CartPole clients saturating each rank, {res['cpu_count']} cores shared",
                        ("ranks", "clients per rank", "env steps/s", "vs 1 rank", "learner rows/s"), rows)
    solves = []
    for label, runs in res["solve"].items():
        done = [r["wall_s"] for r in runs if r["solved"]]
        solves.append((label, f"{len(done)} of {len(runs)}",
                       fmt_mr(median_range(done, 1), 1) + " s" if done else "–",
                       ", ".join(f"{r['wall_s']} s" if r["solved"] else "not solved" for r in runs)))
    return table + "\n\n" + print_table("(b) CartPole time to mean return 450 (last 100 episodes, "
                                        "all clients)", ("set-up", "solved", "median (min–max)",
                                                         "runs"), solves)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="measured window of (a)")
    ap.add_argument("--clients", type=int, default=2, help="clients per rank in (a)")
    ap.add_argument("--solve-runs", type=int, default=2, help="runs of each set-up in (b)")
    ap.add_argument("--budget-s", type=float, default=300.0, help="longest run of (b)")
    ap.add_argument("--out", default=None, help="result file (default bench/results/cluster_jobs.json)")
    args = ap.parse_args()
    import os
    res = {"cpu_count": os.cpu_count(), "scaling_16_cores": "not measured",
           "throughput": [throughput(r, args.clients, args.seconds) for r in (1, 2)],
           "solve": {"2 ranks x 2 clients": [], "1 rank x 4 clients": []}}
    for seed in range(args.solve_runs):
        res["solve"]["2 ranks x 2 clients"].append(solve(2, 2, seed, args.budget_s))
        res["solve"]["1 rank x 4 clients"].append(solve(1, 4, seed, args.budget_s))
    res["summary_markdown"] = markdown(res)
    write_result("cluster_jobs", res, args.out)


if __name__ == "__main__":
    main()
