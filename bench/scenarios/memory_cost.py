"""Cost of memory: the demo set-up and one served action with an LSTM policy against the
feed-forward one, same run, interleaved.

    python -m bench.scenarios.memory_cost [--runs 3] [--seconds 10] [--quick]

1. ``env_steps_per_s``: the demo set-up (``rlinkd serve`` with the default config, 2
   ``rlinkd client`` processes of CartPole-v1, client_lib's Agent with client-side
   inference, as ``rlinkd demo`` starts them) over TCP and over shared memory, with
   ``ppo.recurrent = none`` and ``lstm`` (``recurrent_size`` 64, ``max_seq_len`` 20, the
   defaults). After a 3-s warm-up, steps/s = growth of the daemon's ``env_steps`` over
   ``--seconds``. The order is run-major and alternates the cells, so load drifts hit both
   alike; median (min-max) of ``--runs`` runs per point.
2. ``served_action_us``: one client, one action at a time (``act`` + ``step`` with
   ``connect(..., inference="server")``, ``bench.scenarios.serving.one_client_latency``)
   over shared-memory lanes and TCP (a direct connection), against a daemon that does not
   train during the measurement; p50 and p99 per daemon, the cells alternating, the median
   over ``--runs`` daemons of each.
Writes bench/results/memory_cost.json.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.harness.common import median_range, write_result
from bench.scenarios.serving import one_client_latency
from rlinkd.daemon.demo import start_clients, start_daemon
from rlinkd.daemon.launch import ServeProcess, set_args, stop_processes

CELLS = {"none": [], "lstm": ["ppo.recurrent=lstm", "ppo.recurrent_size=64", "ppo.max_seq_len=20"]}
TRANSPORTS = ("tcp", "shm")
# No training during the latency measurement: a batch far beyond the actions measured (the
# serving scenario's 10^8-step batch would ask for a slot of ~200 GB with an LSTM's states).
NO_TRAINING = ["sampling.train_batch_size=100000", "ppo.minibatch_size=100", "server.max_connections=512"]
CLIENTS = 2
WARMUP_S = 3.0


def demo_steps_per_s(cell: str, transport: str, seconds: float, seed: int) -> dict:
    """The demo's daemon and clients for ``WARMUP_S`` + ``seconds``: env steps/s of the window
    and the learner's last update time (on-policy clients wait for it)."""
    state_dir = Path(tempfile.mkdtemp(prefix="rlinkd-bench-memory-")) / "state"
    daemon = start_daemon(state_dir, CELLS[cell], seed)
    clients = []
    try:
        info = daemon.wait_ready(120.0)
        clients = start_clients(CLIENTS, transport, info, state_dir, seed)
        time.sleep(WARMUP_S)
        before, t0 = daemon.status()["env_steps"], time.monotonic()
        time.sleep(seconds)
        status = daemon.status()
        return {"steps_per_s": round((status["env_steps"] - before) / (time.monotonic() - t0), 1),
                "update_time_s": round(status["learner"].get("update_time_s") or 0.0, 3)}
    finally:
        stop_processes(clients)
        daemon.stop(30.0)


def served_latency(cell: str, n: int) -> dict:
    """p50/p99 (µs) of one served action over shared memory and TCP, one fresh daemon."""
    state_dir = Path(tempfile.mkdtemp(prefix="rlinkd-bench-memory-served-")) / "state"
    with ServeProcess(state_dir, set_args([*NO_TRAINING, *CELLS[cell]])) as d:
        time.sleep(2.0)                    # (as bench.scenarios.serving: the roles settle)
        return {t: one_client_latency(d, t, n) for t in TRANSPORTS}


def summarize(runs: list[dict], served: list[dict]) -> dict:
    steps = {t: {c: median_range([r["steps_per_s"] for r in runs if r["transport"] == t and r["cell"] == c], 0)
                 for c in CELLS} for t in TRANSPORTS}
    for t in TRANSPORTS:
        none, lstm = steps[t]["none"]["median"], steps[t]["lstm"]["median"]
        steps[t]["lstm_share_of_feed_forward"] = round(lstm / none, 3) if none and lstm else None
        steps[t]["update_time_s"] = {c: median_range([r["update_time_s"] for r in runs
                                                      if r["transport"] == t and r["cell"] == c])
                                     for c in CELLS}
    latency = {t: {c: {q: median_range([s[t][q] for s in served if s["cell"] == c], 1) for q in ("p50", "p99")}
                   for c in CELLS} for t in TRANSPORTS}
    return {"env_steps_per_s": steps, "served_action_us": latency}


def table_markdown(result: dict) -> str:
    """Rows: steps/s per transport, then the served action's p50 per transport."""
    s = result["summary"]
    lines = ["| measure | feed-forward | LSTM 64 | LSTM / feed-forward |", "| --- | --- | --- | --- |"]
    for t, name in (("tcp", "TCP"), ("shm", "shared memory")):
        e = s["env_steps_per_s"][t]
        lines.append(f"| demo env steps/s, {name} | {e['none']['median']:,.0f} ({e['none']['min']:,.0f} – "
                     f"{e['none']['max']:,.0f}) | {e['lstm']['median']:,.0f} ({e['lstm']['min']:,.0f} – "
                     f"{e['lstm']['max']:,.0f}) | {e['lstm_share_of_feed_forward']:.2f} |")
    for t, name in (("shm", "shared memory"), ("tcp", "TCP")):
        a = s["served_action_us"][t]
        none, lstm = a["none"]["p50"]["median"], a["lstm"]["p50"]["median"]
        lines.append(f"| one served action p50, {name} | {none:.0f} µs | {lstm:.0f} µs | {lstm / none:.2f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0, help="measured window of each demo run")
    ap.add_argument("--quick", action="store_true", help="one run of 4 s, 1,000 served actions")
    ap.add_argument("--out", help="result file (default: bench/results/memory_cost.json)")
    args = ap.parse_args()
    runs_n, seconds, n = (1, 4.0, 1000) if args.quick else (args.runs, args.seconds, 5000)
    runs, served = [], []
    for run in range(runs_n):
        for t in TRANSPORTS:
            for cell in (CELLS if run % 2 == 0 else reversed(CELLS)):
                runs.append({"run": run, "transport": t, "cell": cell, **demo_steps_per_s(cell, t, seconds, run)})
                print(runs[-1], flush=True)
        for cell in (CELLS if run % 2 == 0 else reversed(CELLS)):
            served.append({"run": run, "cell": cell, **served_latency(cell, n)})
            print(served[-1], flush=True)
    result = {"clients": CLIENTS, "seconds": seconds, "runs": runs, "served": served,
              "summary": summarize(runs, served)}
    result["table_markdown"] = table_markdown(result)
    path = write_result("memory_cost", result, args.out)
    print(result["table_markdown"])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
