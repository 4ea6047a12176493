"""The inference role as the collector's *internal client*: one Unix-socket connection per
trainable policy, exactly like a co-located shared-memory client (PING with the topology's
internal token, ATTACH for that policy's ring, step records into the ring, SAMPLE_READY),
so served steps train exactly like client-side data and are counted the same way.

On-policy (``sampling.force_on_policy``): after SAMPLE_READY the policy is *held* until the
collector's WEIGHTS_READY says weights trained on those steps are on the board; held
training requests wait in their lanes (evaluation requests are still served).
Every call is non-blocking except ``connect`` (bounded by ``CONNECT_TIMEOUT_S``) and the
small frame writes; a lost connection raises ``ConnectionError`` and the shell reconnects.
"""
from __future__ import annotations

import os
import select
import time

import numpy as np

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol.serving import EvalEpisode, EvalResults, MAX_EVAL_EPISODES
from rlinkd.client_lib.shm_client import request_ring
from rlinkd.client_lib.transport import Address, RLlinkClient
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.records import StepLayout
from rlinkd.shm.ring import StepRing

CONNECT_TIMEOUT_S = 10.0
RING_RECORDS = 1 << 17
WRITE_TIMEOUT_S = 30.0
# One ring write per this many bytes of queued step records (``coalesce_records``: at most
# MAX_COALESCE, at least AT_ONCE_RECORDS; a CartPole record is ~100 bytes, an 84x84x3 image
# one ~21 KB), or once the first queued record is COALESCE_S old (``flush``: at once).
COALESCE_BYTES = 1 << 17
MAX_COALESCE = 1024
COALESCE_S = 0.008
AT_ONCE_RECORDS = 64  # a batch this big is written at once (after what is queued)


def coalesce_records(record_bytes: int) -> int:
    """How many step records of this size a link queues before a ring write."""
    return max(AT_ONCE_RECORDS, min(MAX_COALESCE, COALESCE_BYTES // record_bytes))


class PolicyLink:
    """One trainable policy's connection and ring. Built by the inference shell per policy."""

    def __init__(self, socket_path: str, token: str, policy: str, layout: StepLayout) -> None:
        self.socket_path, self.token, self.policy, self.layout = socket_path, token, policy, layout
        self.client: RLlinkClient | None = None
        self.ring: StepRing | None = None
        self.held = False
        self.exploration: dict | None = None  # the last WEIGHTS_READY's (DQN epsilon)
        self.steps = 0          # training steps written since the last SAMPLE_READY
        self.unsent_records = 0
        self.coalesce = coalesce_records(layout.record_bytes)
        self.queue = layout.empty(self.coalesce)  # records not in the ring yet
        self.queued = 0
        self.first_queued_at = 0.0

    def connect(self) -> None:
        """Handshake and ring (blocking, bounded). ``ConnectionError``/``OSError`` if the
        collector is not there yet; the caller retries with backoff."""
        client = RLlinkClient(Address("unix", path=self.socket_path), timeout_s=CONNECT_TIMEOUT_S).connect()
        try:
            client.ping(self.token)
            attached, fd = request_ring(client, RING_RECORDS, self.policy)
            ring = StepRing.attach_fd(fd, attached.ring_name, expected_layout=self.layout)
            fifo = os.open(attached.doorbell_path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            ring.doorbell = Doorbell(fifo)
        except BaseException:
            client.close()
            raise
        self.client, self.ring, self.held, self.steps = client, ring, False, 0

    @property
    def connected(self) -> bool:
        return self.client is not None

    def fileno(self) -> int:
        assert self.client is not None and self.client.sock is not None
        return self.client.sock.fileno()

    def write(self, records: np.ndarray, train_steps: int) -> None:
        """Queue step records for the ring: written once ``self.coalesce`` are queued or
        the first of them is ``COALESCE_S`` old (small batches, e.g. the lone requests of
        many clients: one collector wake-up per several, and the collector and connector
        pay per batch, so a bigger one costs them less per step: 64 -> 256 records took 64
        training C clients from ~91,000 to ~115,000 actions/s on 2 cores; 256 in 2 ms ->
        1,024 in 8 ms their CPU from ~4.3 to ~2.6 us per step); a batch
        of ``AT_ONCE_RECORDS`` or more goes at once (after what is queued), before its
        clients are woken, so the collector works while they step: holding those back cost
        a 64-env vector client 20 % of its rate. Waits for ring space: the collector
        drains it."""
        n = len(records)
        if n:
            if n >= AT_ONCE_RECORDS or self.queued + n > self.coalesce:
                self.flush()
            if n >= AT_ONCE_RECORDS:
                self._write(records)
            else:
                if not self.queued:
                    self.first_queued_at = time.perf_counter()
                self.queue[self.queued:self.queued + n] = records
                self.queued += n
        self.steps += train_steps
        self.flush(only_old=True)

    def flush(self, only_old: bool = False) -> None:
        """Write the queued records now (``only_old``: if the first is ``COALESCE_S`` old).
        The role calls it after each turn and when it wakes (only_old; it sleeps no longer
        than ``due_in_s``), and before SAMPLE_READY and close (all)."""
        if self.queued and (not only_old or time.perf_counter() - self.first_queued_at >= COALESCE_S):
            self._write(self.queue[:self.queued])
            self.queued = 0

    def due_in_s(self) -> float | None:
        """Seconds until the queued records are due (``flush(only_old=True)`` writes them);
        None when nothing is queued. The idle role sleeps no longer than this."""
        if not self.queued:
            return None
        return max(0.0, self.first_queued_at + COALESCE_S - time.perf_counter())

    def _write(self, records: np.ndarray) -> None:
        assert self.ring is not None
        self.ring.write_batch(records, timeout_s=WRITE_TIMEOUT_S)

    def sample_ready(self, on_policy: bool) -> None:
        """Hand the steps written so far on; on-policy, hold until WEIGHTS_READY."""
        assert self.client is not None
        self.flush()
        self.client.send(codec.SampleReady(env_steps=self.steps, get_state=on_policy))
        self.steps = 0
        self.held = on_policy

    def poll_release(self) -> bool:
        """Read a waiting WEIGHTS_READY (non-blocking): True once the hold ends."""
        if not self.held or self.client is None or self.client.sock is None:
            return False
        if not select.select([self.client.sock], [], [], 0)[0]:
            return False
        reply = self.client.recv()
        if not isinstance(reply, codec.WeightsReady):
            raise ConnectionError(f"internal link: expected WEIGHTS_READY, got {reply.TYPE.value}")
        self.held = False
        self.exploration = reply.exploration
        return True

    def send_eval(self, episodes: list[EvalEpisode]) -> None:
        assert self.client is not None
        for i in range(0, len(episodes), MAX_EVAL_EPISODES):
            self.client.send(EvalResults(tuple(episodes[i:i + MAX_EVAL_EPISODES])))

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()
        if self.client is not None:
            self.client.close()
        self.client, self.ring, self.held, self.queued = None, None, False, 0
