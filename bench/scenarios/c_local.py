"""The C client's client-side inference alone: steps/s of its act + record loop, feed-forward
against GRU and LSTM, beside numpy's interpreter of the same network.

    python -m bench.scenarios.c_local [--runs 5] [--size 64] [--seconds 2] [--quick] [--out FILE]

No daemon: bench/drivers/local_loop.c (built here against the C client's library, -O2) runs the
client's rlk_local, what ``rlk_client`` runs with ``--inference client`` over shared memory
(batched forward of client_lib/c/src/rlk_mlp.c, action draw, state carry, each step staged as a
record), for one agent on a CartPole-sized policy (Box(4,) observation, Discrete(2) action, the
default 64x64 trunk; for a recurrent policy an LSTM or GRU cell of hidden size ``--size``
between the normalised observation and the trunk, ``max_seq_len`` 20), on a cycle of fixed
observations, reward 1, episodes of 200 steps, a sample every 256 steps whose records are
dropped where the client writes them into its ring and waits for the daemon. The peer, in the
same run: the Python client's client-side inference on the same network and weights
(``client_lib.policy.BoardPolicy`` — NumpyNet, one BLAS thread — and ``ActionChooser``, the
state carried from step to step), one agent, the same observations; it stages no records (its
act alone). ``--runs`` runs of each (cell, arm) of about ``--seconds``, interleaved (cells in
turn, the arms' order alternating per run). Per cell and arm the median steps/s and the spread
(min - max), and C's ratio to numpy.
Writes bench/results/c_local.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # (cli.THREAD_POOL_VARS)
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from bench.harness.common import REPO, fmt_mr, median_range, write_result  # noqa: E402
from bench.scenarios.c_client import build  # noqa: E402
from rlinkd.client_lib.policy import ActionChooser, BoardPolicy  # noqa: E402
from rlinkd.client_lib.protocol.netops import network_json  # noqa: E402
from rlinkd.client_lib.protocol.policy_spec import PolicySpec  # noqa: E402
from rlinkd.client_lib.protocol.spaces import Box, Discrete  # noqa: E402

CELLS, ARMS = ("none", "gru", "lstm"), ("c", "numpy")
MAX_SEQ_LEN, SAMPLE_STEPS, EPISODE_STEPS, N_OBS = 20, 256, 200, 64


def make_case(cell: str, size: int) -> tuple[PolicySpec, np.ndarray, dict]:
    """The spec, its initial weights and the driver's case (observations from a fixed seed)."""
    spec = PolicySpec(Box((4,)), Discrete(2), recurrent=cell, recurrent_size=size, max_seq_len=MAX_SEQ_LEN)
    flat = spec.init_flat(np.random.default_rng(0)).astype(np.float32)
    obs = np.random.default_rng(1).normal(scale=0.5, size=(N_OBS, 4)).astype(np.float32)
    case = {"network": network_json(spec.net, spec.action_components), "weights": flat.tolist(),
            "obs_size": spec.obs_size, "act_size": spec.action_size, "dist_size": spec.dist_size, "act_n": 2,
            "max_seq_len": MAX_SEQ_LEN, "env_steps_per_sample": SAMPLE_STEPS, "episode_steps": EPISODE_STEPS,
            "obs": obs.reshape(-1).tolist(), "seed": 11}
    return spec, flat, case


def c_rate(driver: Path, case_path: Path, seconds: float) -> float:
    """Steps/s of one local_loop run of about ``seconds``."""
    done = subprocess.run([str(driver), str(case_path), str(seconds)], capture_output=True, text=True,
                          check=True, timeout=seconds + 60)
    return float(json.loads(done.stdout)["steps_per_s"])


def numpy_rate(spec: PolicySpec, flat: np.ndarray, obs: np.ndarray, seconds: float) -> float:
    """Steps/s of the Python client's client-side act (forward, draw, state carry) for ``seconds``."""
    policy, chooser = BoardPolicy(spec, flat, 0), ActionChooser(spec.act_space, seed=11)
    zero = np.zeros((1, spec.state_size), np.float32) if spec.state_size else None
    state, steps, t0 = zero, 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        for _ in range(SAMPLE_STEPS):
            dist, state = policy.forward(obs[steps % N_OBS][None], state)
            chooser.choose(dist, explore=True)
            steps += 1
            state = zero if steps % EPISODE_STEPS == 0 else state
    return steps / elapsed


def measure(driver: Path, size: int, runs: int, seconds: float, work: Path) -> dict:
    """{cell: {arm: [steps/s, one per run]}}, cells in turn and the arms' order alternating."""
    cases = {cell: make_case(cell, size) for cell in CELLS}
    for cell, (_, _, case) in cases.items():
        (work / f"{cell}.json").write_text(json.dumps(case))
    got: dict = {cell: {arm: [] for arm in ARMS} for cell in CELLS}
    for i in range(runs):
        for cell, (spec, flat, case) in cases.items():
            obs = np.asarray(case["obs"], np.float32).reshape(N_OBS, 4)
            for arm in (ARMS if i % 2 == 0 else ARMS[::-1]):
                rate = (c_rate(driver, work / f"{cell}.json", seconds) if arm == "c"
                        else numpy_rate(spec, flat, obs, seconds))
                got[cell][arm].append(round(rate, 1))
        print(i, {cell: {a: v[-1] for a, v in arms.items()} for cell, arms in got.items()}, flush=True)
    return got


def table_markdown(result: dict) -> str:
    """One row per cell: both arms' steps/s (median, min - max) and C's ratio to numpy."""
    lines = [f"| policy (H={result['size']}) | C client, steps/s | numpy (Python client), steps/s | C / numpy |",
             "| --- | --- | --- | --- |"]
    names = {"none": "feed-forward", "gru": "GRU", "lstm": "LSTM"}
    for cell, arms in result["steps_per_s"].items():
        ratio = arms["c"]["median"] / arms["numpy"]["median"]
        lines.append(f"| {names[cell]} | {fmt_mr(arms['c'])} | {fmt_mr(arms['numpy'])} | {ratio:.1f}x |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="runs of each cell and arm, interleaved")
    ap.add_argument("--size", type=int, default=64, help="the recurrent cell's hidden size H")
    ap.add_argument("--seconds", type=float, default=2.0, help="seconds of one run")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1 run of 0.2 s per cell and arm")
    ap.add_argument("--out", help="result file (default: bench/results/c_local.json)")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.seconds = 1, 0.2
    with tempfile.TemporaryDirectory(prefix="rlinkd-bench-c-local-") as tmp:
        work = Path(tmp)
        build(work)
        driver = work / "local_loop"
        subprocess.run(["cc", "-O2", "-std=c99", "-I", str(REPO / "client_lib" / "c" / "include"),
                        "-I", str(REPO / "client_lib" / "c" / "src"), str(REPO / "bench" / "drivers" / "local_loop.c"),
                        str(work / "librlinkd.a"), "-lm", "-pthread", "-o", str(driver)], check=True, timeout=120)
        runs = measure(driver, args.size, args.runs, args.seconds, work)
    result = {"quick": args.quick, "runs_per_arm": args.runs, "size": args.size, "seconds": args.seconds,
              "blas_threads": os.environ["OPENBLAS_NUM_THREADS"], "runs": runs,
              "steps_per_s": {cell: {arm: median_range(v, 0) for arm, v in arms.items()}
                              for cell, arms in runs.items()}}
    result["table_markdown"] = table_markdown(result)
    write_result("c_local", result, args.out)
    print(result["table_markdown"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
