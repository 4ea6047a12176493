"""A recurrent policy's step in the inference role: the native interpreter against numpy.

    python -m bench.scenarios.recurrent_step_ab [--runs 5] [--size 64] [--calls-ms 200] [--quick]
                                                [--out FILE]

One process, one policy per cell (LSTM and GRU, hidden size ``--size``, a CartPole-sized
observation Box(4,), Discrete(2), the default trunk), the two steps the role may choose
between (``backend.STEP_MAKERS["native"]`` and ``["numpy"]``: (obs, state) -> (dist,
state_out)) at batch sizes 1, 8 and 64, fed a nonzero state. ``--runs`` runs of each arm,
interleaved (native, numpy, numpy, native, ...: the order alternates per run); one run
times back-to-back calls for about ``--calls-ms`` and gives microseconds per call. Per cell,
batch size and arm the median and the spread (min - max); the verdict is native_ab's: "gain"
when every native run beats every numpy run, "loss" when every numpy run beats every native
run, else "noise". The role itself times the candidates per batch size at start and keeps
the faster (``choose_backend``); this measures whether the native step earns a place there.
numpy runs with one BLAS thread, as in the role (``cli.limit_thread_pools``; set here before
numpy is imported, unless the environment chose otherwise).
Writes bench/results/recurrent_step_ab.json.
"""
from __future__ import annotations

import argparse
import os
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # (cli.THREAD_POOL_VARS)
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from bench.harness.common import fmt_mr, write_result  # noqa: E402
from bench.scenarios.native_ab import compare  # noqa: E402
from rlinkd.client_lib.protocol.policy_spec import PolicySpec  # noqa: E402
from rlinkd.client_lib.protocol.spaces import Box, Discrete  # noqa: E402
from rlinkd.daemon.inference.backend import STEP_MAKERS  # noqa: E402

CELLS, BATCHES, ARMS = ("lstm", "gru"), (1, 8, 64), ("native", "numpy")


def us_per_call(step, obs: dict, state: np.ndarray, budget_s: float) -> float:
    """Microseconds per call of ``step(obs, state)``, back to back for about ``budget_s``."""
    step(obs, state)
    calls, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < budget_s:
        for _ in range(16):
            step(obs, state)
        calls += 16
    return elapsed / calls * 1e6


def measure(cell: str, size: int, runs: int, budget_s: float) -> dict:
    """{batch: {arm: [us per call, one per run]}} of one cell's steps, arms interleaved."""
    spec = PolicySpec(Box((4,)), Discrete(2), recurrent=cell, recurrent_size=size)
    flat = spec.init_flat(np.random.default_rng(0))
    steps = {arm: STEP_MAKERS[arm](spec, flat) for arm in ARMS}
    rng = np.random.default_rng(1)
    got: dict = {rows: {arm: [] for arm in ARMS} for rows in BATCHES}
    for i in range(runs):
        for rows in BATCHES:
            obs = {"": rng.normal(size=(rows, 4)).astype(np.float32)}
            state = rng.normal(scale=0.5, size=(rows, spec.state_size)).astype(np.float32)
            for arm in (ARMS if i % 2 == 0 else ARMS[::-1]):
                got[rows][arm].append(us_per_call(steps[arm], obs, state, budget_s))
        print(cell, i, {rows: {a: round(v[-1], 1) for a, v in arms.items()} for rows, arms in got.items()},
              flush=True)
    return got


def table_markdown(result: dict) -> str:
    """One row per cell and batch size: both arms (median, min - max), gain, spread, verdict."""
    lines = [f"| cell (H={result['size']}) | batch | native µs/call | numpy µs/call | gain | spread | counts |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for cell, batches in result["cells"].items():
        for rows, c in batches.items():
            lines.append(f"| {cell} | {rows} | {fmt_mr(c['on'], 1)} | {fmt_mr(c['off'], 1)} | "
                         f"{100 * c['gain']:+.1f} % | "
                         f"{100 * c['spread']:.1f} % | {c['verdict']} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="runs of each arm, interleaved")
    ap.add_argument("--size", type=int, default=64, help="the cell's hidden size H")
    ap.add_argument("--calls-ms", type=float, default=200.0, help="milliseconds of back-to-back calls per run")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 2 runs an arm, 20 ms each")
    ap.add_argument("--out", help="result file (default: bench/results/recurrent_step_ab.json)")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.calls_ms = 2, 20.0
    runs = {cell: measure(cell, args.size, args.runs, args.calls_ms / 1e3) for cell in CELLS}
    cells = {cell: {str(rows): compare(arms["native"], arms["numpy"], higher_better=False)
                    for rows, arms in got.items()} for cell, got in runs.items()}
    result = {"quick": args.quick, "runs_per_arm": args.runs, "size": args.size, "calls_ms": args.calls_ms,
              "blas_threads": os.environ["OPENBLAS_NUM_THREADS"],
              "runs_us": {cell: {str(r): a for r, a in got.items()} for cell, got in runs.items()},
              "cells": cells}
    result["table_markdown"] = table_markdown(result)
    write_result("recurrent_step_ab", result, args.out)
    print(result["table_markdown"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
