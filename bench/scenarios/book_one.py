"""A lone request's serving turn in Python: ``LaneBook.apply_one`` against ``apply`` on one row.

    python -m bench.scenarios.book_one [--runs 5] [--requests 3000]

The inference role keeps two Python implementations of a request's episode bookkeeping:
``LaneBook.apply`` (vectorised, every batch) and ``apply_one`` (scalar, a lone request:
``Executor.one``, daemon/inference/execute.py). This measures what the second saves: one in-process
``InferenceServer`` (CartPole policy, numpy backend, every native part off, so no request
goes to step.c), one lane, an episode of STEPs; per request the median time of
``serve_once`` (scan, bookkeeping, forward pass, draw, answer) with lone requests served by
``Executor.one`` (apply_one) and by ``Executor.many`` on one row (apply), ``--runs`` runs of each,
interleaved. Prints medians and min – max per arm; writes no result file (a figure for the
choice documented at ``LaneBook.apply_one``).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

from bench.harness.common import median_range
from rlinkd.daemon import policies as P
from rlinkd.daemon.config import load_config
from rlinkd.daemon.inference.backend import PolicyRunner
from rlinkd.daemon.inference.episodes import SlotPool
from rlinkd.daemon.inference.policy_serving import PolicyServing
from rlinkd.daemon.inference.server import InferenceServer
from rlinkd.daemon.inference.policy_lanes import ServedArea
from rlinkd.daemon.wiring import step_layout
from rlinkd.shm.board import WeightsBoard
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.lanes import OP_START, OP_STEP, LaneArea, LaneLayout

OBS = np.array([0.01, 0.02, 0.03, 0.04], np.float32)


def one_lane_server(tmp: Path) -> tuple[InferenceServer, LaneArea]:
    """An InferenceServer over one lane of the default CartPole policy, in Python only."""
    d = P.policy_defs(load_config(None, []))["default"]
    board = WeightsBoard.create(str(tmp / "board"), d.spec.n_params(), orjson.dumps(d.spec.to_json()))
    board.publish(1, np.random.default_rng(0).normal(size=d.spec.n_params()).astype(np.float32) * 0.1)
    runner = PolicyRunner("default", d.spec, d.obs_space, d.act_space, board, "numpy", seed=0, native=False)
    server = InferenceServer({"default": PolicyServing(runner, d.obs_space, SlotPool(), None, 1 << 30)},
                             max_batch=64, max_wait_s=0.0, on_policy=False, native_parts=())
    area = LaneArea.create(str(tmp / "lanes"), LaneLayout(step_layout(d)), 1)
    with open(tmp / "lanes", "rb+") as f:
        server.add(ServedArea(0, area, "default", Doorbell.create()), f.fileno())
    return server, area


def turn_us(batch_path: bool, requests: int) -> float:
    """Median µs of a lone STEP's ``serve_once`` (``batch_path``: through ``apply``)."""
    server, area = one_lane_server(Path(tempfile.mkdtemp(prefix="rlinkd-book-one-")))
    if batch_path:
        execute = server.execute
        execute.one = lambda name, policy, pl, req, bad: execute.many(  # type: ignore[method-assign]
            name, policy, pl, req, np.array([bad]))
    lanes, times = area.lanes, []
    for i in range(requests + 1):
        lanes["obs"]["obs"][0], lanes["op"][0], lanes["reward"][0] = OBS, OP_STEP if i else OP_START, 1.0
        area.publish(0)
        t0 = time.perf_counter()
        server.serve_once()
        times.append(time.perf_counter() - t0)
    server.close()
    return 1e6 * statistics.median(times[1:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="runs of each arm, interleaved")
    ap.add_argument("--requests", type=int, default=3000, help="lone STEPs per run")
    args = ap.parse_args()
    arms: dict[str, list[float]] = {"apply_one": [], "apply, one row": []}
    for _ in range(args.runs):
        for name, values in arms.items():
            values.append(turn_us(name != "apply_one", args.requests))
    for name, values in arms.items():
        m = median_range(values, 1)
        print(f"{name:>15}: {m['median']:.1f} µs a lone request's turn ({m['min']:.1f} – {m['max']:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
