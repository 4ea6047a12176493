"""Fuzzing the shared-memory side: corrupted rings (unit) and hostile ATTACH clients (live).

A shared-memory client can write any byte of its own ring, header included: the tail
counter, the head counter (the daemon's), flags, floats, padding. The collector must
either read records that pass validation or refuse the ring (InvalidEpisode → ERROR to
that client, ring never read again) — never crash, spin, or read out of bounds. Live, a
client that attaches, scribbles over its ring and sends SAMPLE_READY gets at most an
ERROR and a closed connection, while the daemon stays up with no child restarted and a
well-behaved shm client keeps training.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import socket

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlinkd.client_lib import connect, run_env
from rlinkd.client_lib.protocol.masking import mask_spec
from rlinkd.client_lib.protocol.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, record_fields
from rlinkd.client_lib.shm_client import receive_ring_fd
from rlinkd.daemon.collector.ingest import InvalidEpisode, Spaces
from rlinkd.daemon.collector.core import single_policy
from rlinkd.daemon.collector.shm_clients import ShmClients
from rlinkd.shm.records import FINAL_OBS, StepLayout
from rlinkd.shm.ring import HEAD_OFFSET, TAIL_OFFSET, StepRing, records_offset
from tests.helpers import raw_recv, raw_send

OBS, ACT = Box((4,), low=-5.0, high=5.0), Discrete(2)
LAYOUT = StepLayout.flat(4, 1, 2)
SPACES = Spaces(OBS, ACT, dist_size=2)
RING_RECORDS = 1024
RECORDS_OFFSET = records_offset(LAYOUT)
RING_BYTES = RECORDS_OFFSET + RING_RECORDS * LAYOUT.record_bytes

# a composite layout: integer leaves of several widths and an action mask the actions obey
C_OBS = Dict({"camera": Box((3, 3, 1), "uint8", 0, 200), "mode": Discrete(3, start=1),
              "pos": Box((2,), low=-1.0, high=1.0), "action_mask": MultiBinary(5)})
C_ACT = Dict({"turn": Discrete(3), "gears": MultiDiscrete([2])})
C_LAYOUT = StepLayout(record_fields(C_OBS), C_ACT.action_size, C_ACT.dist_size)
C_SPACES = Spaces(C_OBS, C_ACT, C_ACT.dist_size, mask_spec(C_OBS, C_ACT, "action_mask"))
C_RING_BYTES = records_offset(C_LAYOUT) + RING_RECORDS * C_LAYOUT.record_bytes


def valid_records(n: int, layout: StepLayout = LAYOUT) -> np.ndarray:
    """``n`` steps of one episode fragment plus its final observation."""
    rec = layout.empty(n + 1)
    if layout == LAYOUT:
        rec["obs"]["obs"] = np.linspace(-0.4, 0.4, 4 * (n + 1), dtype=np.float32).reshape(n + 1, 4)
        rec["action"][:, 0] = np.arange(n + 1) % 2
    else:
        obs = rec["obs"]
        obs["camera"] = (np.arange(n + 1) % 200).reshape(-1, 1, 1, 1)
        obs["mode"], obs["pos"], obs["action_mask"] = 1 + np.arange(n + 1) % 3, 0.5, 1
        obs["action_mask"][:, 1] = 0                  # turn choice 1 is never legal
        rec["action"][:, 0] = 2 * (np.arange(n + 1) % 2)
        rec["action"][:, 1] = np.arange(n + 1) % 2
    rec["reward"][:n] = 1.0
    rec["flags"][n] = FINAL_OBS
    return rec


@contextlib.contextmanager
def attached(steps: int | None = None, layout: StepLayout = LAYOUT, spaces: Spaces = SPACES):
    """A collector-side ShmClients with client 1 attached; ``steps`` valid steps written by a
    producer first (None: nothing). Detaches (closes the ring) on exit."""
    clients = ShmClients("fz", single_policy(spaces, layout), 1024, itertools.count(100).__next__)
    ring = clients.attach(1, 1, "default", RING_RECORDS)
    try:
        if steps is not None:
            producer = client_side(ring)
            producer.write_batch(valid_records(steps, layout))
            producer.close()
        yield clients, ring
    finally:
        clients.detach(1)


def client_side(ring: StepRing) -> StepRing:
    """The producer's own mapping of a collector-made ring, as a client gets it."""
    assert ring.segment.fd is not None
    return StepRing.attach_fd(os.dup(ring.segment.fd), "fz", ring.layout, role="producer")


def scribble(ring: StepRing, writes) -> None:
    """Write bytes anywhere into the ring's memfd, as its client could."""
    assert ring.segment.fd is not None
    size = records_offset(ring.layout) + RING_RECORDS * ring.layout.record_bytes
    for offset, data in writes:
        os.pwrite(ring.segment.fd, data[:size - offset], offset)


offsets = st.one_of(st.integers(0, RECORDS_OFFSET - 1),            # the header, counters included
                    st.sampled_from([TAIL_OFFSET, HEAD_OFFSET]),
                    st.integers(RECORDS_OFFSET, RING_BYTES - 1))     # the records
scribbles = st.lists(st.tuples(offsets, st.binary(min_size=1, max_size=12)), min_size=1, max_size=6)


@settings(max_examples=400, deadline=None, database=None)
@given(steps=st.integers(0, 300), writes=scribbles)
def test_a_scribbled_ring_is_read_validated_or_refused(steps, writes):
    with attached(steps) as (clients, ring):
        scribble_and_check(clients, ring, writes)


c_offsets = st.one_of(st.integers(0, records_offset(C_LAYOUT) - 1),
                      st.sampled_from([TAIL_OFFSET, HEAD_OFFSET]),
                      st.integers(records_offset(C_LAYOUT), C_RING_BYTES - 1))


@settings(max_examples=200, deadline=None, database=None)
@given(steps=st.integers(0, 300),
       writes=st.lists(st.tuples(c_offsets, st.binary(min_size=1, max_size=12)), min_size=1, max_size=6))
def test_a_scribbled_composite_ring_is_read_validated_or_refused(steps, writes):
    with attached(steps, C_LAYOUT, C_SPACES) as (clients, ring):
        scribble_and_check(clients, ring, writes)


def test_valid_composite_records_pass_and_a_masked_action_is_refused():
    """The composite fuzz starts from records that pass (so scribbles are what it tests)."""
    with attached(20, C_LAYOUT, C_SPACES) as (clients, _):
        assert len(clients.read(1, "default", 256)) == 21
    with attached(None, C_LAYOUT, C_SPACES) as (clients, ring):
        bad = valid_records(3, C_LAYOUT)
        bad["action"][1, 0] = 1                      # the mask forbids turn choice 1
        producer = client_side(ring)
        producer.write_batch(bad)
        producer.close()
        with pytest.raises(InvalidEpisode, match="action mask forbids"):
            clients.read(1, "default", 256)


def scribble_and_check(clients: ShmClients, ring: StepRing, writes) -> None:
    """Scribble over the ring, then read: every read passes or the ring is refused for good."""
    scribble(ring, writes)
    read = refused = 0
    for _ in range(RING_RECORDS // 256 + 2):
        try:
            read += len(clients.read(1, "default", 256))
        except InvalidEpisode:
            refused += 1
            break
    if refused:  # refused for good: never read again, never reported readable, no busy loop
        with pytest.raises(InvalidEpisode):
            clients.read(1, "default", 256)
        assert clients.readable() == [] and clients.arm() is False
    else:
        assert read <= RING_RECORDS and clients.readable() == []


@pytest.mark.parametrize("tail, head", [(2**64 - 1, 0), (RING_RECORDS + 1, 0), (0, 5)])
def test_impossible_counters_are_refused(tail, head):
    with attached() as (clients, ring):
        scribble(ring, [(TAIL_OFFSET, tail.to_bytes(8, "little")), (HEAD_OFFSET, head.to_bytes(8, "little"))])
        assert clients.readable() == [(1, "default")]
        with pytest.raises(InvalidEpisode, match="ring counters corrupt"):
            clients.read(1, "default", 256)
        assert clients.readable() == [] and clients.arm() is False


def test_a_closed_flag_alone_is_no_news():
    """A ring whose client set ``closed`` but wrote nothing must let the collector sleep."""
    with attached() as (clients, ring):
        producer = client_side(ring)
        producer.mark_closed()
        producer.close()
        assert clients.readable() == [] and clients.arm() is False


def test_a_leaving_clients_ring_is_no_longer_watched_but_still_drained():
    """After its connection closed, the drain loop must not spin on the ring; detach reads it."""
    with attached(10) as (clients, _):
        clients.leave(1)
        assert clients.readable() == [] and clients.arm() is False
        assert len(clients.read(1, "default", 1 << 14)) == 11


def test_reads_never_exceed_the_unread_count_checked():
    """A full ring read with a chunk larger than the ring returns at most ``capacity`` records."""
    with attached(RING_RECORDS - 1) as (clients, _):
        assert len(clients.read(1, "default", 1 << 14)) == RING_RECORDS


# ---------------------------------------------------------------- live daemon
def unix_request(sock: socket.socket, obj: dict) -> dict:
    raw_send(sock, obj)
    return raw_recv(sock)


def replies_until_close(sock: socket.socket) -> list[str]:
    """Message types the daemon sends until it closes or goes quiet (after a PING)."""
    seen = []
    try:
        raw_send(sock, {"type": "PING"})
    except OSError:  # already closed after an ERROR: read what was sent before
        pass
    try:
        while True:
            seen.append(raw_recv(sock)["type"])
            if seen[-1] == "PONG":
                return seen
    except (ConnectionError, OSError, json.JSONDecodeError):
        return seen


@settings(max_examples=60, deadline=None, database=None)
@given(steps=st.integers(0, 200), writes=scribbles)
def test_hostile_attach_clients_spare_the_daemon(shared_daemon, steps, writes):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(20)
    sock.connect(shared_daemon.unix_socket)
    try:
        attached = unix_request(sock, {"type": "ATTACH", "pid": os.getpid(), "capacity_records": RING_RECORDS})
        assert attached["type"] == "ATTACHED", attached
        ring_fd = receive_ring_fd(sock)
        try:
            producer = StepRing.attach_fd(os.dup(ring_fd), attached["ring_name"],
                                          StepLayout.from_json(attached["layout"]), role="producer")
            producer.write_batch(valid_records(steps).astype(producer.layout.dtype))
            producer.close()
            size = os.fstat(ring_fd).st_size
            for offset, data in writes:
                os.pwrite(ring_fd, data[:size - min(offset, size - 1)], min(offset, size - 1))
        finally:
            os.close(ring_fd)
        raw_send(sock, {"type": "SAMPLE_READY", "env_steps": steps, "get_state": False})
        seen = replies_until_close(sock)
        assert set(seen) <= {"WEIGHTS_READY", "ERROR", "PONG"}, seen
    finally:
        sock.close()


def test_zz_daemon_and_a_valid_shm_client_after_the_hostile_ones(shared_daemon):
    status = shared_daemon.status()
    assert shared_daemon.proc.poll() is None
    assert all(c["alive"] and c["restarts"] == 0 for c in status["children"].values()), status["children"]
    agent = connect(f"shm:{shared_daemon.state_dir}")
    stats = run_env(gym.make("CartPole-v1"), agent, steps=2 * agent.env_steps_per_sample, seed=1)
    assert stats.steps == 2 * agent.env_steps_per_sample
    agent.close()
    log = shared_daemon.log()
    for bad in ("Traceback", '"level": "critical"'):
        assert bad not in log, log[log.index(bad) - 1500:][:4000]
