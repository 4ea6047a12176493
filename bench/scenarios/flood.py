"""Connection-flood benchmark: a real client's handshake with 1,000 silent sockets open.

    .venv/bin/python -m bench.scenarios.flood [--sockets 1000] [--runs 5] [--quick] [--out FILE]

A default ``rlinkd serve`` (``max_connections`` 256, ``max_pending_connections`` 128,
``handshake_timeout_s`` 10) is started once. Each run opens ``--sockets`` TCP connections
to it that send nothing, waits until the daemon has accepted every one of them (its
status: evicted + pending grew by the flood's size), then a client_lib client connects and
times connect → PING → PONG → GET_CONFIG → SET_CONFIG → GET_STATE → SET_STATE (wall clock,
``time.perf_counter``). The flood sockets are then closed and the daemon's connection
count is awaited back at zero before the next run. The same handshake with no flood open
(``baseline``) is timed first, ``--runs`` times. The process's open-file soft limit is
raised to fit the flood (never above the hard limit).

Target (issue 15): the flooded handshake's median ≤ 1 s. Writes ``bench/results/flood.json``
and prints a markdown table.
"""
from __future__ import annotations

import argparse
import resource
import socket
import time

from rlinkd.client_lib.transport import Address, RLlinkClient

from bench.harness.common import LOOPBACK, median_range, print_table, write_result
from bench.harness.daemon import Daemon
from bench.report.targets import FLOOD_HANDSHAKE

SPARE_FDS = 256
"""File descriptors beyond the flood (the daemon's log, status and client connections)."""


def raise_fd_limit(needed: int) -> int:
    """Raise RLIMIT_NOFILE's soft limit to ``needed`` (capped at the hard limit); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def handshake_ms(port: int) -> float:
    """Milliseconds from connect to the SET_STATE reply (PING, GET_CONFIG, GET_STATE)."""
    t0 = time.perf_counter()
    with RLlinkClient(Address("tcp", host=LOOPBACK, port=port), timeout_s=60.0).connect() as client:
        client.ping()
        client.get_config()
        client.get_state()
        return (time.perf_counter() - t0) * 1e3


def open_flood(port: int, n: int) -> list[socket.socket]:
    """``n`` TCP connections that will never send a byte."""
    return [socket.create_connection((LOOPBACK, port), timeout=60.0) for _ in range(n)]


def admitted_total(status: dict) -> int:
    """Connections the daemon has accepted and not yet seen close on their own."""
    return status["evicted_connections"] + status["pending_connections"]


def wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def flooded_run(d: Daemon, n: int) -> dict:
    """One run: open the flood, wait until all of it is accepted, time the handshake, clean up."""
    before = admitted_total(d.status())
    t0 = time.perf_counter()
    flood = open_flood(d.port, n)
    opened_s = time.perf_counter() - t0
    wait_until(lambda: admitted_total(d.status()) - before >= n, 120.0, "the flood to be accepted")
    ms = handshake_ms(d.port)
    status = d.status()
    for sock in flood:
        sock.close()
    wait_until(lambda: d.status()["connections"] <= 1, 120.0, "the flood's connections to close")
    return {"handshake_ms": round(ms, 2), "flood_open_s": round(opened_s, 2),
            "pending_during": status["pending_connections"], "evicted_total": status["evicted_connections"],
            "refused_total": status["refused_connections"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sockets", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="200 sockets, 2 runs")
    ap.add_argument("--out", help="result file (default: bench/results/flood.json)")
    args = ap.parse_args()
    sockets, runs = (200, 2) if args.quick else (args.sockets, args.runs)
    fd_limit = raise_fd_limit(sockets + SPARE_FDS)
    if fd_limit < sockets + SPARE_FDS:
        raise SystemExit(f"open-file limit {fd_limit} is too small for {sockets} sockets")
    with Daemon() as d:
        handshake_ms(d.port)  # warm-up: first SET_STATE frame built
        baseline = [handshake_ms(d.port) for _ in range(runs)]
        flooded = [flooded_run(d, sockets) for _ in range(runs)]
    result = {"sockets": sockets, "runs": runs, "quick": args.quick,
              "baseline_ms": median_range(baseline, 2),
              "flooded_ms": median_range([r["handshake_ms"] for r in flooded], 2),
              "flooded_runs": flooded}
    result["table_markdown"] = table(result)
    write_result("flood", result, args.out)


def table(result: dict) -> str:
    """The BENCHMARKS.md table: the handshake without and with the flood open."""
    def mr(d: dict) -> str:
        return f"{d['median']} ({d['min']} – {d['max']})"
    last = result["flooded_runs"][-1]
    rows = [("none", mr(result["baseline_ms"]), "–"),
            (f"{result['sockets']:,} silent TCP sockets", mr(result["flooded_ms"]),
             f"{last['evicted_total']:,} evicted, {last['refused_total']} refused, "
             f"{last['pending_during']} pending at the end")]
    return print_table(f"Connect → PING → GET_CONFIG → GET_STATE → SET_STATE of a real client, ms, median "
                       f"(min – max) of {result['runs']} runs (target: flooded median "
                       f"{FLOOD_HANDSHAKE.bound_text()})",
                       ("flood open", "handshake ms", "daemon's counters after the last run"), rows)


if __name__ == "__main__":
    main()
