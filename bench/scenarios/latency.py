"""Latency benchmark: SET_STATE replies, weights publication, client scaling, start-up.

    .venv/bin/python -m bench.scenarios.latency [--quick]

Writes ``bench/results/latency.json`` and prints markdown tables. All clients are raw
sockets on 127.0.0.1 (client_lib connections or asyncio streams) sending pre-encoded frames
of CartPole-sized episodes (``bench.harness.rllink``, built with the shared codec).

1. ``set_state_reply``: one client sends EPISODES_AND_GET_STATE with a 500-step episode and
   times the SET_STATE reply (send start → last reply byte).
   - ``on_policy`` (default config): the reply waits until the learner trained on a batch
     holding these steps. After every reply the client reads the daemon's status, whose
     ``learner`` stats belong to the version it just received (checked through
     ``weights_seq_no``), and subtracts ``learner.update_time_s`` (``Learner.update`` wall
     time, measured by the learner): ``excluding_training`` = everything else on the path
     (decode, validation, ring, flush marker, connector pipeline with values and GAE, slot
     hand-off, publish, WeightsPublished, ONNX re-encode, send).
   - ``off_policy`` (``sampling.force_on_policy=false``): no training wait at all; the reply
     is the collector's own cost (decode, validation, ring write, cached SET_STATE frame).
     Requests are paced (0.2 s apart) so the learner never applies backpressure.
2. ``weights_publication``: the real classes in-process (``Learner``, ``WeightsBoard``,
   ``WeightsCache``, ``Inbox``) after one real update of a 1,024-row batch: flat weights,
   board publish, board read, SET_STATE frame rebuild (read + ONNX initializers + gzip +
   base64 + frame), and two cross-process hops measured with a forked peer: board
   visibility (publisher stamps ``perf_counter_ns`` as the seq_no, the peer spins on
   ``latest_seq_no``) and the learner→collector inbox message (WeightsPublished carrying a
   stamp). ``update_to_board_us`` = flat + publish; ``update_to_set_state_us`` = flat +
   publish + inbox hop + frame rebuild (medians).
3. ``scaling``: N concurrent TCP clients (1, 2, 4, 8, 16, 64) each loop EPISODES_AND_GET_STATE
   (510 steps) → SET_STATE as fast as replies come, off-policy, spread over client worker
   processes (asyncio). Ingested steps/s = steps acknowledged in the window / window;
   latency p50/p99 per request. ``collector`` = the real collector alone
   (``bench.harness.collector``: nothing trains, so no backpressure: the collector's
   capacity); ``daemon`` = ``rlinkd serve`` off-policy (fresh per point; 1, 8, 64 clients),
   where a full episode ring makes the replies wait for the learner (ingest = the
   learner's pace after the first ~0.5 s). ``paced`` = the collector alone with 64 clients
   each sending one request per period, the periods chosen so the offered load is 25, 50
   and 75 % of the 64-client saturated capacity: closed-loop saturation makes latency
   N × service time for any server (Little's law), paced clients show what simulators
   producing steps below capacity see.
4. ``startup``: ``rlinkd serve`` spawned with ``NOTIFY_SOCKET`` naming a datagram socket we
   bind; time from spawn to the ``READY=1`` notification (median of 5).
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.transport import RLlinkClient
from rlinkd.daemon.launch import ServeProcess

from bench.harness.collector import IsolatedCollector
from bench.harness.common import LOOPBACK, fmt_mr, fmt_num, median_range, percentiles, print_table, write_result
from bench.harness.daemon import Daemon
from bench.harness.rllink import STEPS_PER_MESSAGE, connect_tcp, episodes_frame, frame, read_body

REPLY_STEPS = 500


# ---------------------------------------------------------------- 1. SET_STATE replies
def _timed_request(client: RLlinkClient, request: bytes) -> tuple[float, codec.Message]:
    """(milliseconds from send to the whole reply, decoded reply)."""
    t0 = time.perf_counter()
    client.sock.sendall(request)
    reply = client.recv()
    return (time.perf_counter() - t0) * 1e3, reply


def on_policy_replies(n: int) -> dict:
    """Default (on-policy) daemon: reply time, the learner's update time, the difference."""
    request = episodes_frame("EPISODES_AND_GET_STATE", REPLY_STEPS, REPLY_STEPS)
    total, update, excl, mismatched = [], [], [], 0
    with Daemon() as d:
        client = connect_tcp(d.port)
        _timed_request(client, request)  # warm-up: first batch, first ONNX export paths
        for _ in range(n):
            ms, reply = _timed_request(client, request)
            learner = d.status().get("learner") or {}
            if learner.get("weights_seq_no") != reply.weights_seq_no:
                mismatched += 1  # stats of another version: cannot subtract reliably
                continue
            total.append(ms)
            update.append(learner["update_time_s"] * 1e3)
            excl.append(ms - learner["update_time_s"] * 1e3)
        client.close()
    return {"reply_ms": percentiles(total, ndigits=2), "learner_update_ms": percentiles(update, ndigits=2),
            "excluding_training_ms": percentiles(excl, ndigits=2), "skipped_mismatched": mismatched}


def off_policy_replies(n: int, pace_s: float = 0.2) -> dict:
    """Off-policy daemon: the reply does not wait for training (paced: no backpressure)."""
    request = episodes_frame("EPISODES_AND_GET_STATE", REPLY_STEPS, REPLY_STEPS)
    times = []
    with Daemon(["sampling.force_on_policy=false"]) as d:
        client = connect_tcp(d.port)
        _timed_request(client, request)
        for _ in range(n):
            time.sleep(pace_s)
            times.append(_timed_request(client, request)[0])
        client.close()
    return {"reply_ms": percentiles(times, ndigits=2), "pace_s": pace_s}


# ---------------------------------------------------------------- 2. weights publication
def _trained_learner(cfg, spec):
    """A real Learner (default hyperparameters) after one update on a 1,024-row batch."""
    from rlinkd.daemon.learner.learner import Learner
    learner = Learner(spec, cfg.ppo, device="cpu", seed=0, torch_threads=cfg.learner.torch_threads)
    rng = np.random.default_rng(0)
    n = 1024
    batch = {"obs": rng.uniform(-0.2, 0.2, (n, 4)).astype(np.float32),
             "actions": rng.integers(0, 2, (n, 1)).astype(np.float32),
             "logp": np.full(n, -0.69, np.float32), "advantages": rng.normal(size=n).astype(np.float32),
             "value_targets": rng.normal(size=n).astype(np.float32), "values": np.zeros(n, np.float32)}
    return learner, learner.update(batch)["update_time_s"]


def _time_us(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return out


def _board_spinner(board_path: str, n: int, conn) -> None:
    """Forked peer: spin on latest_seq_no; each new value is a perf_counter_ns stamp."""
    from rlinkd.shm.board import WeightsBoard
    board = WeightsBoard.attach(board_path)
    seen, last, deadline = [], board.latest_seq_no(), time.monotonic() + 60
    while len(seen) < n and time.monotonic() < deadline:
        seq = board.latest_seq_no()
        if seq != last:
            seen.append((time.perf_counter_ns() - seq) / 1e3)
            last = seq
    conn.send(seen)
    os._exit(0)


def board_visibility_us(board, n: int) -> list[float]:
    """Publish → visible to another process spinning on the board (µs)."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()
    flat = np.zeros(board.n_params, np.float32)
    peer = ctx.Process(target=_board_spinner, args=(board.path, n, child))
    peer.start()
    time.sleep(0.3)
    for _ in range(n):
        board.publish(time.perf_counter_ns(), flat)
        time.sleep(0.003)
    seen = parent.recv()
    peer.join(10)
    return seen


def _inbox_receiver(inbox, n: int, conn) -> None:
    """Forked peer: block on the inbox like the collector; stamp arrival of each message."""
    lat = []
    for _ in range(n):
        msg = inbox.recv(10.0)
        if msg is None:
            break
        lat.append((time.perf_counter_ns() - msg.cutoff_ingest_id) / 1e3)  # the stamp
    conn.send(lat)
    os._exit(0)


def inbox_hop_us(n: int) -> list[float]:
    """WeightsPublished over an Inbox (SOCK_SEQPACKET) to a blocked peer process (µs)."""
    from rlinkd.daemon import messages as m
    from rlinkd.daemon.ipc import Inbox
    inbox = Inbox("collector")
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()
    peer = ctx.Process(target=_inbox_receiver, args=(inbox, n, child))
    peer.start()
    time.sleep(0.3)
    for i in range(n):
        state = m.LearnerState(lr=0.001, ent_coef=0.0, updates=i, trained_steps=0, rejected_batches=0)
        inbox.send(m.WeightsPublished(i, time.perf_counter_ns(), state, None))  # stamp as cutoff
        time.sleep(0.003)
    lat = parent.recv()
    peer.join(10)
    inbox.close()
    return lat


def weights_publication(n: int) -> dict:
    """Each piece of learner update → board → SET_STATE, with the real classes.

    The two cross-process hops are measured first, with forked peers, before torch is
    imported (forking a process that runs torch is asking for trouble).
    """
    from rlinkd.daemon.collector.weights import WeightsCache
    from rlinkd.daemon.config import load_config
    from rlinkd.daemon.wiring import make_policy_spec, resolve_spaces
    from rlinkd.shm.board import WeightsBoard
    cfg = load_config(None, [("daemon", "state_dir", "/nonexistent/rlinkd-bench")])  # nothing is written
    spec = make_policy_spec(cfg, *resolve_spaces(cfg))
    path = f"/dev/shm/rlinkdbench{os.getpid()}.board"
    board = WeightsBoard.create(path, spec.n_params(), orjson.dumps(spec.to_json()))
    try:
        pieces = {"board_visibility_cross_process_us": board_visibility_us(board, n),
                  "inbox_hop_cross_process_us": inbox_hop_us(n)}
        learner, update_s = _trained_learner(cfg, spec)
        cache = WeightsCache(board, spec)
        out = np.empty(spec.n_params(), np.float32)
        seq = iter(range(1, 10 ** 9))
        flat = learner.flat_weights()
        pieces |= {"flat_weights_us": _time_us(learner.flat_weights, n),
                   "board_publish_us": _time_us(lambda: board.publish(next(seq), flat), n),
                   "board_read_us": _time_us(lambda: board.read(out), n)}

        def publish_and_refresh():
            board.publish(next(seq), flat)
            t0 = time.perf_counter_ns()
            cache.refresh()
            return (time.perf_counter_ns() - t0) / 1e3
        pieces["set_state_rebuild_us"] = [publish_and_refresh() for _ in range(n)]
    finally:
        board.close()
        board.unlink()
    summary = {k: percentiles(v, ndigits=1) for k, v in pieces.items()}
    med = {k: v["p50"] for k, v in summary.items()}
    summary["update_to_board_us"] = round(med["flat_weights_us"] + med["board_publish_us"], 1)
    summary["update_to_set_state_us"] = round(summary["update_to_board_us"] + med["inbox_hop_cross_process_us"]
                                              + med["set_state_rebuild_us"], 1)
    summary["n_params"] = spec.n_params()
    summary["set_state_frame_bytes"] = len(cache.frame)
    summary["learner_update_1024_rows_ms"] = round(update_s * 1e3, 1)
    return summary


# ---------------------------------------------------------------- 3. scaling
async def _client_loop(port: int, request: bytes, t_start: float, t_end: float, out: dict,
                       period_s: float = 0.0) -> None:
    """One connection: EPISODES_AND_GET_STATE → SET_STATE until ``t_end``; records the window.

    ``period_s`` = 0: the next request as soon as the reply is in (closed loop, saturation).
    Otherwise one request every ``period_s`` from a random phase (a simulator producing
    510 steps in ``period_s``); a late reply delays only that client's next send.
    """
    reader, writer = await asyncio.open_connection(LOOPBACK, port, limit=1 << 22)
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for obj in ({"type": "PING"}, {"type": "GET_CONFIG"}):
        writer.write(frame(obj))
        await read_body(reader)
    next_send = time.monotonic() + random.uniform(0, period_s)
    while time.monotonic() < t_end:
        if period_s:
            await asyncio.sleep(max(0.0, next_send - time.monotonic()))
            next_send = max(next_send + period_s, time.monotonic())
        t0 = time.monotonic()
        writer.write(request)
        await writer.drain()
        await read_body(reader)
        t1 = time.monotonic()
        if t0 >= t_start and t1 <= t_end:
            out["lat_ms"].append((t1 - t0) * 1e3)
            out["steps"] += STEPS_PER_MESSAGE
    writer.close()


def scaling_worker(port: int, n_conns: int, t_start: float, t_end: float, conn,
                   period_s: float = 0.0) -> None:
    """Worker process: ``n_conns`` asyncio connections; sends back latencies and steps."""
    request = episodes_frame("EPISODES_AND_GET_STATE")
    out = {"lat_ms": [], "steps": 0}

    async def run_all():
        await asyncio.gather(*(_client_loop(port, request, t_start, t_end, out, period_s)
                               for _ in range(n_conns)))
    asyncio.run(run_all())
    conn.send(out)


def scaling_point(port: int, n_clients: int, window_s: float, warmup_s: float = 1.0,
                  period_s: float = 0.0) -> dict:
    """N clients over min(N, 2) worker processes; steps/s and latency in the window."""
    ctx = mp.get_context("spawn")
    n_workers = min(n_clients, 2)
    t_start = time.monotonic() + 1.5 + warmup_s  # workers need ~1 s to start (spawn)
    t_end = t_start + window_s
    pipes, procs = [], []
    for w in range(n_workers):
        share = n_clients // n_workers + (1 if w < n_clients % n_workers else 0)
        parent, child = ctx.Pipe()
        p = ctx.Process(target=scaling_worker, args=(port, share, t_start, t_end, child, period_s))
        p.start()
        pipes.append(parent)
        procs.append(p)
    outs = [p.recv() for p in pipes]
    for p in procs:
        p.join(30)
    lat = [x for o in outs for x in o["lat_ms"]]
    steps = sum(o["steps"] for o in outs)
    return {"clients": n_clients, "steps_per_s": round(steps / window_s),
            "reply_ms": percentiles(lat, ndigits=2), "period_ms": round(period_s * 1e3, 1)}


def scaling_collector(counts: list[int], window_s: float) -> list[dict]:
    """The collector alone, one instance for every client count (increasing), saturated."""
    points = []
    with IsolatedCollector(["sampling.force_on_policy=false"]) as c:
        for n in counts:
            points.append(scaling_point(c.port, n, window_s))
            _print_point("collector alone", points[-1])
    return points


def scaling_paced(n_clients: int, capacity_steps_per_s: float, loads: list[float],
                  window_s: float) -> list[dict]:
    """The collector alone, ``n_clients`` paced so the offered load is a fraction of capacity.

    Closed-loop saturation makes every server's latency N × its service time (Little's law);
    this measures the reply latency 64 simulators see when they produce steps at a given
    fraction of what the collector can ingest.
    """
    points = []
    with IsolatedCollector(["sampling.force_on_policy=false"]) as c:
        for load in loads:
            period_s = n_clients * STEPS_PER_MESSAGE / (load * capacity_steps_per_s)
            points.append(scaling_point(c.port, n_clients, window_s, period_s=period_s))
            points[-1]["offered_load"] = load
            _print_point(f"collector, paced at {load:.0%} of capacity", points[-1])
    return points


def scaling_daemon(counts: list[int], window_s: float) -> list[dict]:
    """``rlinkd serve`` off-policy, a fresh daemon per client count (no backlog carried over).

    The episode ring (131,072 records) absorbs the first ~0.5 s; after that replies wait
    for room, i.e. for the learner, so this shows the end-to-end ceiling and what the wait
    does to reply latency, not the collector's capacity.
    """
    points = []
    for n in counts:
        with Daemon(["sampling.force_on_policy=false"]) as d:
            points.append(scaling_point(d.port, n, window_s, warmup_s=0.0))
            points[-1]["learner"] = {k: (d.status().get("learner") or {}).get(k)
                                     for k in ("updates", "trained_steps", "update_time_s")}
        _print_point("rlinkd serve", points[-1])
    return points


def _print_point(label: str, p: dict) -> None:
    print(f"  {label}: {p['clients']:>3} clients {fmt_num(p['steps_per_s']):>9} steps/s  "
          f"p50 {p['reply_ms']['p50']} ms  p99 {p['reply_ms']['p99']} ms", flush=True)


# ---------------------------------------------------------------- 4. start-up
def startup_once(timeout_s: float = 120.0) -> float:
    """Seconds from spawning ``rlinkd serve`` to its READY=1 datagram; then stop it."""
    tmp = Path(tempfile.mkdtemp(prefix="rlinkd-bench-notify-"))
    path = str(tmp / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(1.0)
        daemon = ServeProcess(tmp / "state", env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": None})
        t0 = time.monotonic()
        daemon.launch()
        try:
            elapsed = _wait_ready(sock, daemon.proc, t0, timeout_s)
        finally:
            daemon.stop()
            shutil.rmtree(tmp, ignore_errors=True)
    return elapsed


def _wait_ready(sock: socket.socket, proc: subprocess.Popen, t0: float, timeout_s: float) -> float:
    while time.monotonic() - t0 < timeout_s:
        try:
            data = sock.recv(4096)
        except TimeoutError:
            if proc.poll() is not None:
                raise RuntimeError(f"rlinkd serve exited with {proc.returncode} before READY") from None
            continue
        if b"READY=1" in data.split(b"\n"):
            return time.monotonic() - t0
    raise RuntimeError(f"no READY=1 within {timeout_s} s")


def startup(runs: int) -> dict:
    times = [startup_once() for _ in range(runs)]
    print(f"  start-up to READY: {', '.join(f'{t:.2f}' for t in times)} s", flush=True)
    return {"runs_s": [round(t, 3) for t in times], "ready_s": median_range(times, 3)}


# ---------------------------------------------------------------- report
def tables(res: dict) -> str:
    sr, wp = res["set_state_reply"], res["weights_publication"]
    on, off = sr["on_policy"], sr["off_policy"]
    rows = [("SET_STATE reply, on-policy, total", f"{on['reply_ms']['p50']} ms", f"{on['reply_ms']['p99']} ms"),
            ("  of which the learner's update (`update_time_s`)", f"{on['learner_update_ms']['p50']} ms",
             f"{on['learner_update_ms']['p99']} ms"),
            ("  **excluding training** (reply − update_time_s, per request)",
             f"{on['excluding_training_ms']['p50']} ms", f"{on['excluding_training_ms']['p99']} ms"),
            ("SET_STATE reply, off-policy (no training wait)", f"{off['reply_ms']['p50']} ms",
             f"{off['reply_ms']['p99']} ms")]
    text = print_table(f"SET_STATE reply latency, {REPLY_STEPS}-step batch, 1 TCP client",
                       ("measure", "p50", "p99"), rows)
    keys = [("flat_weights_us", "learner: flat weights"), ("board_publish_us", "board publish"),
            ("board_visibility_cross_process_us", "publish → visible in another process"),
            ("board_read_us", "board read (copy)"),
            ("inbox_hop_cross_process_us", "WeightsPublished inbox hop (cross-process)"),
            ("set_state_rebuild_us", "SET_STATE frame rebuild (read + ONNX + gzip + base64)")]
    rows = [(label, f"{wp[k]['p50']} µs", f"{wp[k]['p99']} µs") for k, label in keys]
    rows += [("**update → readable on the board**", f"{wp['update_to_board_us']} µs", ""),
             ("**update → new SET_STATE ready**", f"{wp['update_to_set_state_us']} µs", "")]
    text += "\n\n" + print_table(f"Weights publication ({wp['n_params']} params, "
                                 f"{wp['set_state_frame_bytes']:,}-byte SET_STATE)",
                                 ("piece", "p50", "p99"), rows)
    for target, label in (("collector", "the collector alone (no backpressure)"),
                          ("daemon", "rlinkd serve off-policy, end to end (learner-bound)")):
        pts = res["scaling"].get(target) or []
        rows = [(p["clients"], f"{p['steps_per_s']:,}", p["reply_ms"]["p50"], p["reply_ms"]["p99"]) for p in pts]
        if rows:
            text += "\n\n" + print_table(f"Scaling with concurrent TCP clients: {label}",
                                         ("clients", "ingested steps/s", "reply p50 ms", "reply p99 ms"), rows)
    pts = res["scaling"].get("paced") or []
    rows = [(f"{p['offered_load']:.0%}", p["clients"], p["period_ms"], f"{p['steps_per_s']:,}",
             p["reply_ms"]["p50"], p["reply_ms"]["p99"]) for p in pts]
    if rows:
        text += "\n\n" + print_table(
            "64 TCP clients paced below saturation: the collector alone, each client one 510-step "
            "EPISODES_AND_GET_STATE every period (offered load = share of the 64-client capacity above)",
            ("offered load", "clients", "period ms", "ingested steps/s", "reply p50 ms", "reply p99 ms"), rows)
    text += "\n\n" + print_table("Start-up", ("measure", "median (min – max)"),
                                 [("spawn → READY=1 (sd_notify)", fmt_mr(res["startup"]["ready_s"], 2) + " s")])
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples, fewer client counts (smoke test)")
    ap.add_argument("--skip-daemon-scaling", action="store_true")
    args = ap.parse_args()
    q = args.quick
    res: dict = {"quick": q}
    print("1. SET_STATE reply latency", flush=True)
    res["set_state_reply"] = {"on_policy": on_policy_replies(15 if q else 200),
                              "off_policy": off_policy_replies(15 if q else 200)}
    print("2. weights publication", flush=True)
    res["weights_publication"] = weights_publication(100 if q else 1000)
    print("3. scaling", flush=True)
    counts = [1, 4, 64] if q else [1, 2, 4, 8, 16, 64]
    window = 2.0 if q else 6.0
    res["scaling"] = {"collector": scaling_collector(counts, window)}
    capacity = res["scaling"]["collector"][-1]["steps_per_s"]  # the 64-client saturation point
    res["scaling"]["paced"] = scaling_paced(64, capacity, [0.5] if q else [0.25, 0.5, 0.75], window * 2)
    if not args.skip_daemon_scaling:
        res["scaling"]["daemon"] = scaling_daemon([64] if q else [1, 8, 64], 4.0 if q else 10.0)
    print("4. start-up", flush=True)
    res["startup"] = startup(2 if q else 5)
    res["tables_markdown"] = tables(res)
    write_result("latency", res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
