"""Transport benchmark: shared-memory rings vs RLlink over TCP, measured in one run.

    .venv/bin/python -m bench.scenarios.transport [--runs 5] [--quick] [--profile]

Every figure uses CartPole-sized data: 4 observation floats, 1 action, 2 logits and a
log-prob per step (64-byte step records), episodes of 255 steps closed by a FINAL_OBS
record. "Steps" are env steps (FINAL_OBS records are not counted). Results go to
``bench/results/transport.json`` and a markdown table is printed.

a) ``shm_single``: one producer process writes single steps from Python with
   ``StepRing.write_step`` into a ring created by ``ShmClients.attach`` (the collector's
   class, default 32,768 records); one consumer process drains it with the collector's own
   ingestion code per record batch: ``ShmClients.read`` (``read_batch`` +
   ``validate_records`` + episode accounting), stream-id stamping, ingest ids, steps count,
   and a copy into a second ring (the episode ring; its records are consumed at once, as by
   an infinitely fast connector). The consumer sleeps on the doorbell FIFO as the collector
   does. steps/s = steps / (consumer finished validating the last record - producer's
   first write), both read from ``time.perf_counter_ns`` (CLOCK_MONOTONIC, one clock for all
   processes). Median (min-max) of ``--runs`` runs.
b) ``shm_batch``: the same with ``write_batch`` of 1,024-record arrays.
c) ``tcp_daemon``: a raw-socket client sends pre-encoded EPISODES frames (orjson, 2
   episodes = 510 steps, no reply) as fast as the socket takes them into a real
   ``rlinkd serve --set sampling.force_on_policy=false``; steps/s is the growth of the
   daemon's ``env_steps`` (status) over the sending window. The learner trains everything
   that arrives and full batch slots stop the connector, a full episode ring the collector:
   after the ring (131,072 records) fills, this is the *learner's* pace, reported with the
   first second's burst and the learner's trained steps/s to show it.
   ``tcp_collector``: the same client against the real collector alone
   (``bench.harness.collector``: ``CollectorProcess`` with a consumer process draining the
   episode ring, no connector/learner), i.e. the TCP path without backpressure.
d) wake-up latency: a producer waits until the consumer sleeps in ``wait_readable``
   (``reader_sleeping`` set), stamps ``perf_counter_ns()`` into the record's i64
   ``weights_seq_no`` and writes one step; the consumer computes now - stamp as soon as
   ``wait_readable`` returns. Doorbell = the collector's FIFO (as the daemon uses) and an
   eventfd. ``daemon_round_trip``: a shm client of a real off-policy daemon writes one
   1-step sample into its ring, sends SAMPLE_READY and waits for WEIGHTS_READY (doorbell
   FIFO, asyncio loop, drain, validation, episode ring, reply) - time from before the
   ring write to the reply.
e) idle CPU: a default daemon with 8 attached shared-memory clients that sent one tiny
   sample each and then stay silent; CPU seconds (user+system, psutil) of the daemon's
   whole process tree over the window, as % of one core, with a per-role breakdown.

Targets (issue 3): (a) >= 1,000,000 steps/s, (b) >= 20,000,000 steps/s, (d) p50 <= 30 us
(and a waiting reader wakes within 100 us: p99 reported beside), (e) <= 2 % of a core.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import multiprocessing as mp
import os
import pstats
import random
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from rlinkd.daemon.runfiles import query_status

from bench.harness.collector import IsolatedCollector
from bench.harness.common import fmt_mr, fmt_num, median_range, percentiles, print_table, write_result
from bench.harness.daemon import Daemon
from bench.harness.proctree import tree_cpu_s
from bench.harness.rllink import EPISODE_STEPS, STEPS_PER_MESSAGE, connect_tcp, episodes_frame
from bench.report import targets

SHM_DIR = "/dev/shm"
BATCH_RECORDS = 1024


# ---------------------------------------------------------------- data
def cartpole_spaces():
    """(collector ``Spaces``, StepLayout) of CartPole-v1."""
    import gymnasium as gym
    from rlinkd.client_lib.protocol.spaces import space_from_gym
    from rlinkd.daemon.collector.ingest import Spaces
    from rlinkd.shm.records import StepLayout
    env = gym.make("CartPole-v1")
    try:
        obs, act = space_from_gym(env.observation_space), space_from_gym(env.action_space)
        return Spaces(obs, act, act.dist_size), StepLayout.flat(4, 1, 2)
    finally:
        env.close()


def episode_block(layout, n_episodes: int) -> np.ndarray:
    """``n_episodes`` × (255 steps + 1 FINAL_OBS|TERMINATED record), valid for CartPole."""
    from rlinkd.shm.records import FINAL_OBS, HAS_DIST, HAS_LOGP, TERMINATED
    rng = np.random.default_rng(0)
    per = EPISODE_STEPS + 1
    rec = layout.empty(n_episodes * per)
    rec["obs"]["obs"] = rng.uniform(-0.2, 0.2, (len(rec), 4))
    rec["action"][:, 0] = rng.integers(0, 2, len(rec))
    rec["reward"], rec["logp"], rec["dist"] = 1.0, -0.69, 0.05
    rec["weights_seq_no"] = 0
    rec["flags"] = HAS_LOGP | HAS_DIST
    ends = np.arange(per - 1, len(rec), per)
    rec["flags"][ends] = FINAL_OBS | TERMINATED
    rec["action"][ends], rec["reward"][ends], rec["logp"][ends], rec["dist"][ends] = 0, 0, 0, 0
    return rec


# ---------------------------------------------------------------- (a)(b) shm throughput
def _profiled(enabled: bool, fn, *args):
    """Run ``fn(*args)``; with ``enabled``, under cProfile, returning (result, top-15 text)."""
    if not enabled:
        return fn(*args), ""
    prof = cProfile.Profile()
    result = prof.runcall(fn, *args)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
    return result, out.getvalue()


def _ingest_loop(clients, session_id: int, out_ring, stats) -> tuple[int, int]:
    """What the collector does per record batch, until the producer closed its ring.

    Returns (env steps, records) ingested.
    """
    from rlinkd.daemon.collector.shm_server import DRAIN_CHUNK
    from rlinkd.shm.records import FINAL_OBS
    ring = clients.sessions[session_id].rings["default"].ring
    shm = clients.sessions[session_id]
    next_id, steps, records = 1, 0, 0
    while True:
        if not ring.readable_records():
            if ring.is_closed() and not ring.readable_records():
                return steps, records
            ring.wait_readable(1.0)
            continue
        rec = clients.read(session_id, "default", DRAIN_CHUNK)  # read_batch + validate + streams
        n = len(rec)
        rec["ingest_id"] = np.arange(next_id, next_id + n)  # CollectorServer.ingest
        next_id += n
        steps += int(np.count_nonzero((rec["flags"] & FINAL_OBS) == 0))
        for _policy, ret, length in shm.done_episodes:      # CollectorCore.count_shm
            stats.record(ret, length)
        shm.done_episodes = []
        out_ring.write_batch(rec)                           # the episode ring ...
        out_ring.read_batch(out_ring.readable_records())    # ... drained as the connector does
        records += n


def shm_consumer(conn, prefix: str, fifo_path: str, profile: bool, spaces_fn=cartpole_spaces,
                 episode_records: int = 1 << 17) -> None:
    """Consumer process: the collector's side of one shared-memory client (``spaces_fn``:
    a module-level function returning (collector Spaces, StepLayout))."""
    from multiprocessing.reduction import send_handle
    from rlinkd.daemon.collector.ingest import EpisodeStats
    from rlinkd.daemon.collector.shm_clients import ShmClients
    from rlinkd.daemon.collector.shm_server import make_doorbell_fifo
    from rlinkd.shm.ring import StepRing
    from rlinkd.daemon.collector.core import single_policy
    spaces, layout = spaces_fn()
    clients = ShmClients(prefix, single_policy(spaces, layout), 1024, itertools.count(2).__next__)
    ring = clients.attach(1, 1, "default", None)
    ring.doorbell = make_doorbell_fifo(Path(fifo_path))
    out_ring = StepRing.create(f"{SHM_DIR}/{prefix}.episodes", layout, episode_records)
    try:
        conn.send({"ring_name": ring.path.removeprefix("memfd:"), "capacity": ring.capacity})
        send_handle(conn, ring.segment.fd, os.getppid())  # the sealed memfd, as ATTACHED hands it over
        (steps, records), prof = _profiled(profile, _ingest_loop, clients, 1, out_ring, EpisodeStats())
        conn.send({"t_end_ns": time.perf_counter_ns(), "steps": steps, "records": records,
                   "profile": prof})
    finally:
        ring.doorbell.close()
        clients.close()
        out_ring.close()
        out_ring.unlink()
        Path(fifo_path).unlink(missing_ok=True)


def _write_single_steps(ring, n_episodes: int, obs_pool: list, dist: tuple) -> None:
    """The single-step path as a simulator would call it, once per env step."""
    from rlinkd.shm.errors import RingFull
    from rlinkd.shm.records import FINAL_OBS, TERMINATED
    write = ring.write_step
    final_flags = FINAL_OBS | TERMINATED
    for _ in range(n_episodes):
        for j in range(EPISODE_STEPS):
            try:
                write(0, obs_pool[j], j & 1, 1.0, -0.69, dist)
            except RingFull:
                ring.wait_writable(1, 60.0)
                write(0, obs_pool[j], j & 1, 1.0, -0.69, dist)
        try:
            write(final_flags, obs_pool[EPISODE_STEPS], 0, 0.0)
        except RingFull:
            ring.wait_writable(1, 60.0)
            write(final_flags, obs_pool[EPISODE_STEPS], 0, 0.0)


def _write_batches(ring, n_batches: int, block: np.ndarray) -> None:
    """``write_batch`` of the same 1,024-record block, waiting for room when full."""
    for _ in range(n_batches):
        ring.write_batch(block, timeout_s=60.0)


def shm_producer(conn, ring_fd, ring_name: str, fifo_path: str, mode: str, n_steps: int,
                 profile: bool) -> None:
    """Producer process: attach like client_lib's ShmLink (``ring_fd``: a ``SharedFd`` of the
    consumer's sealed ring), then write ``n_steps`` steps."""
    from rlinkd.shm.doorbell import Doorbell
    from rlinkd.shm.records import StepLayout
    from rlinkd.shm.ring import StepRing
    layout = StepLayout.flat(4, 1, 2)
    fifo = os.open(fifo_path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    ring = StepRing.attach_fd(ring_fd.fd, ring_name, expected_layout=layout,
                              doorbell=Doorbell(fifo))  # FIFO doorbell, as ShmLink
    if mode == "single":
        rng = np.random.default_rng(0)
        obs_pool = [tuple(row) for row in rng.uniform(-0.2, 0.2, (EPISODE_STEPS + 1, 4)).tolist()]
        n_episodes = max(1, n_steps // EPISODE_STEPS)
        job, args = _write_single_steps, (ring, n_episodes, obs_pool, (0.05, -0.05))
        steps = n_episodes * EPISODE_STEPS
    else:
        block = episode_block(layout, BATCH_RECORDS // (EPISODE_STEPS + 1))
        n_batches = max(1, n_steps // (len(block) - len(block) // (EPISODE_STEPS + 1)))
        job, args = _write_batches, (ring, n_batches, block)
        steps = n_batches * (len(block) - len(block) // (EPISODE_STEPS + 1))
    conn.send("ready")
    conn.recv()
    t0 = time.perf_counter_ns()
    _, prof = _profiled(profile, job, *args)
    t1 = time.perf_counter_ns()
    ring.mark_closed()
    conn.send({"t_start_ns": t0, "t_written_ns": t1, "steps": steps, "profile": prof})
    ring.close()


def _recv(conn, timeout_s: float, what: str):
    """A message from a benchmark process, or RuntimeError when it sends none in time."""
    if not conn.poll(timeout_s):
        raise RuntimeError(f"no {what} within {timeout_s:g} s (did the process crash?)")
    return conn.recv()


def shm_throughput_run(mode: str, n_steps: int, profile: bool = False) -> dict:
    """One producer/consumer pair; returns steps/s ingested and the producer's own rate."""
    return run_pair((profile,), shm_producer, (mode, n_steps, profile), profile)


def run_pair(consumer_args: tuple, producer, producer_args: tuple, profile: bool = False) -> dict:
    """``shm_consumer(conn, prefix, fifo, *consumer_args)`` and ``producer(conn, ring_fd,
    ring_name, fifo, *producer_args)`` in two spawned processes; the figures of the run
    (steps/s from the producer's first write to the consumer's last validated record)."""
    from multiprocessing.reduction import recv_handle

    from rlinkd.daemon.ipc import SharedFd
    ctx = mp.get_context("spawn")
    prefix = f"rlinkdbench{os.getpid()}x{secrets.token_hex(3)}"
    fifo_path = os.path.join(tempfile.mkdtemp(prefix="rlinkd-bench-fifo-"), "doorbell.fifo")
    c_parent, c_child = ctx.Pipe()
    p_parent, p_child = ctx.Pipe()
    consumer = ctx.Process(target=shm_consumer, args=(c_child, prefix, fifo_path, *consumer_args))
    producer_proc = None
    consumer.start()
    try:
        info = _recv(c_parent, 60, "ring from the consumer")
        ring_fd = SharedFd(recv_handle(c_parent))
        producer_proc = ctx.Process(target=producer, args=(p_child, ring_fd, info["ring_name"],
                                                           fifo_path, *producer_args))
        producer_proc.start()
        ring_fd.close()  # the producer has its own copy now
        _recv(p_parent, 60, "ready from the producer")
        p_parent.send("go")
        prod = _recv(p_parent, 600, "result from the producer")
        cons = _recv(c_parent, 60, "result from the consumer")
        producer_proc.join(30)
        consumer.join(30)
    finally:
        for p in (producer_proc, consumer):
            if p is not None and p.is_alive():
                p.kill()
                p.join(5)
        for path in Path(SHM_DIR).glob(f"{prefix}.*"):  # left behind only by a killed consumer
            path.unlink(missing_ok=True)
        shutil.rmtree(os.path.dirname(fifo_path), ignore_errors=True)
    if cons["steps"] != prod["steps"]:
        raise RuntimeError(f"consumer ingested {cons['steps']} of {prod['steps']} steps")
    wall_ns = cons["t_end_ns"] - prod["t_start_ns"]
    return {"steps": prod["steps"], "wall_s": round(wall_ns / 1e9, 4),
            "steps_per_s": round(prod["steps"] / (wall_ns / 1e9)),
            "producer_steps_per_s": round(prod["steps"] / ((prod["t_written_ns"] - prod["t_start_ns"]) / 1e9)),
            "ring_capacity": info["capacity"],
            **({"producer_profile": prod["profile"], "consumer_profile": cons["profile"]} if profile else {})}


def shm_throughput(mode: str, n_steps: int, runs: int, profile: bool) -> dict:
    results = [shm_throughput_run(mode, n_steps, profile and i == 0) for i in range(runs)]
    for r in results:
        print(f"  shm {mode}: {fmt_num(r['steps_per_s'])} steps/s ingested "
              f"(producer alone {fmt_num(r['producer_steps_per_s'])})", flush=True)
    return {"runs": results, "steps_per_s": median_range([r["steps_per_s"] for r in results], 0),
            "producer_steps_per_s": median_range([r["producer_steps_per_s"] for r in results], 0)}


# ---------------------------------------------------------------- (c) TCP
def tcp_sender(conn, port: int, frame: bytes, duration_s: float) -> None:
    """Client process: handshake, then sendall the same EPISODES frame for ``duration_s``."""
    client = connect_tcp(port)
    conn.send("ready")
    conn.recv()
    frames, deadline = 0, time.monotonic() + duration_s
    while time.monotonic() < deadline:
        client.sock.sendall(frame)
        frames += 1
    conn.send(frames)
    client.close()


def _poll_status(unix_socket: str, until: float, every_s: float = 0.5) -> list[dict]:
    """(t, env_steps, trained_steps) samples of a daemon's status until ``until``."""
    samples = []
    while time.monotonic() < until:
        s = query_status({"unix_socket": unix_socket})
        samples.append({"t": time.monotonic(), "env_steps": s.get("env_steps", 0),
                        "trained_steps": (s.get("connector") or {}).get("trained_steps", 0)})
        time.sleep(every_s)
    return samples


def _rate(samples: list[dict], key: str, t_from: float, t_to: float) -> float | None:
    """Growth of ``key`` per second between the first sample >= t_from and the last <= t_to."""
    window = [s for s in samples if t_from <= s["t"] <= t_to]
    if len(window) < 2 or window[-1]["t"] <= window[0]["t"]:
        return None
    return (window[-1][key] - window[0][key]) / (window[-1]["t"] - window[0]["t"])


def tcp_run(port: int, unix_socket: str, duration_s: float, frame: bytes | None = None,
            steps_per_frame: int = STEPS_PER_MESSAGE, senders: int = 1) -> dict:
    """``senders`` processes sending ``frame`` (default: the CartPole EPISODES frame) for
    ``duration_s``; rates from status samples (burst, whole, last half)."""
    ctx = mp.get_context("spawn")
    frame = frame or episodes_frame("EPISODES")
    pipes = [ctx.Pipe() for _ in range(senders)]
    procs = [ctx.Process(target=tcp_sender, args=(child, port, frame, duration_s)) for _, child in pipes]
    for p in procs:
        p.start()
    try:
        for parent, _ in pipes:
            _recv(parent, 60, "ready from the TCP sender")
        t0 = time.monotonic()
        for parent, _ in pipes:
            parent.send("go")
        samples = _poll_status(unix_socket, t0 + duration_s)
        frames = sum(_recv(parent, 120, "frame count from the TCP sender") for parent, _ in pipes)
        for p in procs:
            p.join(30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    t_end = samples[-1]["t"]
    return {"duration_s": duration_s, "frames_sent": frames, "steps_sent": frames * steps_per_frame,
            "steps_per_s": _round(_rate(samples, "env_steps", t0 + 0.5, t_end)),
            "burst_steps_per_s_first_1s": _round(_rate(samples, "env_steps", t0, t0 + 1.2)),
            "steps_per_s_last_half": _round(_rate(samples, "env_steps", t0 + duration_s / 2, t_end)),
            "trained_steps_per_s_last_half": _round(_rate(samples, "trained_steps", t0 + duration_s / 2, t_end))}


def _round(v: float | None) -> int | None:
    return None if v is None else round(v)


def tcp_daemon(runs: int, duration_s: float) -> dict:
    """(c) into ``rlinkd serve`` (off-policy); a fresh daemon per run (no backlog carried over)."""
    results = []
    for _ in range(runs):
        with Daemon(["sampling.force_on_policy=false"]) as d:
            results.append(tcp_run(d.port, d.unix_socket, duration_s))
        r = results[-1]
        print(f"  tcp daemon: {fmt_num(r['steps_per_s'])} steps/s (first second "
              f"{fmt_num(r['burst_steps_per_s_first_1s'])}, last half {fmt_num(r['steps_per_s_last_half'])}, "
              f"learner {fmt_num(r['trained_steps_per_s_last_half'])})", flush=True)
    return _tcp_summary(results)


def tcp_collector(runs: int, duration_s: float) -> dict:
    """(c) into the collector alone (draining consumer, nothing trains)."""
    results = []
    with IsolatedCollector(["sampling.force_on_policy=false"]) as c:
        for _ in range(runs):
            results.append(tcp_run(c.port, c.unix_socket, duration_s))
            print(f"  tcp collector alone: {fmt_num(results[-1]['steps_per_s'])} steps/s", flush=True)
    return _tcp_summary(results)


def _tcp_summary(results: list[dict]) -> dict:
    keys = ("steps_per_s", "burst_steps_per_s_first_1s", "steps_per_s_last_half",
            "trained_steps_per_s_last_half")
    return {"runs": results} | {k: median_range([r[k] for r in results], 0) for k in keys}


# ---------------------------------------------------------------- (d) wake-up latency
def _latency_producer(ring, make_bell, n: int, seed: int) -> None:
    """Forked child: wait until the consumer sleeps, stamp, write one step; ``n`` times."""
    ring.doorbell = make_bell()
    rnd = random.Random(seed)
    sleeping = ring._sleeping  # the consumer's reader_sleeping cell (benchmark-only peek)
    for _ in range(n):
        deadline = time.monotonic() + 2.0
        while not sleeping[0] and time.monotonic() < deadline:
            time.sleep(50e-6)
        time.sleep(rnd.uniform(200e-6, 600e-6))  # the consumer is inside poll() by now
        ring.write_step(0, (0.0, 0.0, 0.0, 0.0), 0, 1.0, weights_seq_no=time.perf_counter_ns())
    os._exit(0)


def wakeup_latency(kind: str, n: int) -> dict:
    """Consumer (this process) blocked in ``wait_readable``; a forked producer stamps."""
    from rlinkd.daemon.collector.shm_server import make_doorbell_fifo
    from rlinkd.shm.doorbell import Doorbell
    from rlinkd.shm.records import StepLayout
    from rlinkd.shm.ring import StepRing
    layout = StepLayout.flat(4, 1, 2)
    tmp = tempfile.mkdtemp(prefix="rlinkd-bench-lat-")
    ring = StepRing.create(f"{SHM_DIR}/rlinkdbench{os.getpid()}x{secrets.token_hex(3)}.lat", layout, 1024)
    if kind == "fifo":
        fifo_path = Path(tmp) / "doorbell.fifo"
        ring.doorbell = make_doorbell_fifo(fifo_path)
        make_bell = lambda: Doorbell(os.open(fifo_path, os.O_WRONLY | os.O_NONBLOCK))  # noqa: E731
    else:
        ring.doorbell = Doorbell.create()
        make_bell = lambda: ring.doorbell  # noqa: E731  (inherited eventfd)
    latencies_us = []
    child = mp.get_context("fork").Process(target=_latency_producer, args=(ring, make_bell, n, 1))
    child.start()
    try:
        for _ in range(n):
            if not ring.wait_readable(5.0):
                break
            now = time.perf_counter_ns()
            rec = ring.read_batch(8)
            latencies_us += [(now - int(s)) / 1e3 for s in rec["weights_seq_no"]]
        child.join(10)
    finally:
        if child.is_alive():
            child.kill()
        ring.doorbell.close()
        ring.close()
        ring.unlink()
        shutil.rmtree(tmp, ignore_errors=True)
    return percentiles(latencies_us)


def _attach_shm_client(unix_socket: str):
    """client_lib's handshake (PING, GET_CONFIG, ATTACH); returns (client, ring, layout)."""
    from rlinkd.client_lib.shm_client import request_ring
    from rlinkd.client_lib.transport import Address, RLlinkClient
    from rlinkd.shm.doorbell import Doorbell
    from rlinkd.shm.records import StepLayout
    from rlinkd.shm.ring import StepRing
    client = RLlinkClient(Address("unix", path=unix_socket), timeout_s=30).connect()
    client.ping()
    client.get_config()
    att, ring_fd = request_ring(client)
    layout = StepLayout.from_json(att.layout)
    fifo = os.open(att.doorbell_path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    ring = StepRing.attach_fd(ring_fd, att.ring_name, expected_layout=layout,
                              doorbell=Doorbell(fifo))  # FIFO doorbell, as ShmLink
    return client, ring, layout


def _one_step_records(layout) -> np.ndarray:
    """A terminated 1-step episode: 1 step record + 1 FINAL_OBS record."""
    from rlinkd.client_lib.protocol.fragments import Fragment
    from rlinkd.client_lib.protocol.records import fragment_records
    frag = Fragment(obs={"": np.zeros((2, 4), np.float32)}, actions=np.float32([[1]]),
                    rewards=np.array([1.0]), is_terminated=True, is_truncated=False)
    return fragment_records(frag, layout, 0, 0)


def daemon_round_trip(n: int) -> dict:
    """(d) through the daemon: ring write + SAMPLE_READY → WEIGHTS_READY, off-policy."""
    from rlinkd.client_lib.protocol import codec
    latencies_us = []
    with Daemon(["sampling.force_on_policy=false"]) as d:
        client, ring, layout = _attach_shm_client(d.unix_socket)
        rec = _one_step_records(layout)
        try:
            for _ in range(n):
                time.sleep(0.003)  # let the collector go back to sleep (rings armed)
                t0 = time.perf_counter_ns()
                ring.write_batch(rec, timeout_s=5.0)
                client.send(codec.SampleReady(env_steps=1, get_state=True))
                reply = client.recv()
                latencies_us.append((time.perf_counter_ns() - t0) / 1e3)
                assert isinstance(reply, codec.WeightsReady), reply
        finally:
            ring.close()
            client.close()
    return percentiles(latencies_us)


# ---------------------------------------------------------------- (e) idle CPU
def idle_cpu(window_s: float, n_clients: int = 8) -> dict:
    """Daemon tree CPU over ``window_s`` with ``n_clients`` attached, silent shm clients."""
    from rlinkd.client_lib.protocol import codec
    with Daemon() as d:
        attached = []
        try:
            for _ in range(n_clients):
                client, ring, layout = _attach_shm_client(d.unix_socket)
                ring.write_batch(_one_step_records(layout), timeout_s=5.0)
                client.send(codec.SampleReady(env_steps=1, get_state=False))
                client.recv()
                attached.append((client, ring))
            time.sleep(3.0)  # settle: boot work, first status reports
            roles = d.role_pids()
            clients_seen = d.status().get("clients")
            before = tree_cpu_s(d.pid)
            time.sleep(window_s)
            after = tree_cpu_s(d.pid)
        finally:
            for client, ring in attached:
                ring.close()
                client.close()
    delta = {pid: after[pid] - before.get(pid, 0.0) for pid in after}
    by_role = {role: round(100 * delta.get(pid, 0.0) / window_s, 3) for role, pid in roles.items()}
    return {"window_s": window_s, "clients": clients_seen,
            "cpu_percent_of_one_core": round(100 * sum(delta.values()) / window_s, 3),
            "by_role_percent": by_role, "processes": len(after)}


# ---------------------------------------------------------------- report
def _verdict(target: targets.Target, value: float | None) -> str:
    return "not measured" if value is None else "met" if target.met(value) else "missed"


def table(res: dict) -> str:
    """The markdown table of BENCHMARKS.md's transport section (targets from bench.report.targets)."""
    s, b = res["shm_single"]["steps_per_s"], res["shm_batch"]["steps_per_s"]
    fifo, efd, rt = res["wakeup_fifo_us"], res["wakeup_eventfd_us"], res["daemon_round_trip_us"]
    idle = res["idle_cpu"]["cpu_percent_of_one_core"]
    t = targets
    rows = [
        ("shm, 1 client, single steps (`write_step`)", f"{fmt_mr(s)} steps/s", t.SHM_SINGLE.bound_text(),
         _verdict(t.SHM_SINGLE, s["median"])),
        ("shm, 1 client, batches of 1,024 (`write_batch`)", f"{fmt_mr(b)} steps/s", t.SHM_BATCH.bound_text(),
         _verdict(t.SHM_BATCH, b["median"])),
        ("TCP RLlink JSON into `rlinkd serve` (off-policy, learner-bound)",
         f"{fmt_mr(res['tcp_daemon']['steps_per_s'])} steps/s (first second "
         f"{fmt_mr(res['tcp_daemon']['burst_steps_per_s_first_1s'])})", "–", "–"),
        ("TCP RLlink JSON into the collector alone (no backpressure)",
         f"{fmt_mr(res['tcp_collector']['steps_per_s'])} steps/s", "–", "–"),
        ("wake-up, ring + doorbell FIFO (daemon's)", f"p50 {fifo['p50']} µs, p99 {fifo['p99']} µs",
         f"p50 {t.WAKEUP_P50.bound_text()}", _verdict(t.WAKEUP_P50, fifo["p50"])),
        ("wake-up, ring + eventfd doorbell", f"p50 {efd['p50']} µs, p99 {efd['p99']} µs", "–", "–"),
        ("daemon round trip: 1-step sample + SAMPLE_READY → WEIGHTS_READY",
         f"p50 {rt['p50']} µs, p99 {rt['p99']} µs", "–", "–"),
        (f"idle daemon CPU, {res['idle_cpu']['clients']} silent shm clients, {res['idle_cpu']['window_s']:g} s",
         f"{idle:.2f} % of one core", t.IDLE_CPU.bound_text(), _verdict(t.IDLE_CPU, idle)),
    ]
    return print_table("Transport (median (min – max) of "
                       f"{res['runs']} runs; CartPole-sized steps)",
                       ("measure", "result", "target", "status"), rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="small sizes and short windows (smoke test)")
    ap.add_argument("--profile", action="store_true", help="cProfile the first shm run of each mode")
    args = ap.parse_args()
    q = args.quick
    runs = 3 if q and args.runs == 5 else args.runs
    res: dict = {"quick": q, "runs": runs}
    print("(a) shm single steps", flush=True)
    res["shm_single"] = shm_throughput("single", 300_000 if q else 3_000_000, runs, args.profile)
    print("(b) shm batches of 1024", flush=True)
    res["shm_batch"] = shm_throughput("batch", 5_000_000 if q else 60_000_000, runs, args.profile)
    print("(c) TCP", flush=True)
    res["tcp_collector"] = tcp_collector(runs, 2.0 if q else 6.0)
    res["tcp_daemon"] = tcp_daemon(2 if q else runs, 4.0 if q else 10.0)
    print("(d) wake-up latency", flush=True)
    n = 300 if q else 3000
    res["wakeup_fifo_us"] = wakeup_latency("fifo", n)
    res["wakeup_eventfd_us"] = wakeup_latency("eventfd", n)
    res["daemon_round_trip_us"] = daemon_round_trip(200 if q else 2000)
    print("(e) idle CPU", flush=True)
    res["idle_cpu"] = idle_cpu(5.0 if q else 20.0)
    res["targets"] = {t.name: t.bound_text() for t in targets.TRANSPORT}
    res["table_markdown"] = table(res)
    write_result("transport", res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
