"""Shared-memory transport for co-located simulators (no sockets on the data path).

    agent = connect("shm")                  # the daemon of the default state directory
    agent = connect("shm:/var/lib/rlinkd")  # ... of that state directory
    agent = connect("unix:///run/rlinkd/rlinkd.sock")
    agent = connect("auto")                 # shm when a daemon runs here, else TCP

Handshake on the daemon's Unix socket (RLlink framing): PING, GET_CONFIG, ATTACH →
ATTACHED names the weights board and the doorbell FIFO, and is followed by one byte
carrying the client's own ring as a file descriptor (SCM_RIGHTS): a memfd the daemon
created and sealed so that nobody can shrink or grow it. The client verifies the
seals and every header before use (``attach_fd`` refuses a wrong magic/version/layout).
Samples are written into the ring as step records in one batch; SAMPLE_READY asks for
weights; WEIGHTS_READY says which version to read from the board (numpy forward pass,
no torch, no onnxruntime needed).
"""
from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.links import LinkConfig, ReconnectingLink, TcpLink, server_config
from rlinkd.client_lib.protocol.agents import DEFAULT_POLICY
from rlinkd.client_lib.protocol.addresses import LOCAL_KINDS, parse_endpoint
from rlinkd.client_lib.protocol.discovery import default_state_dir, find_socket
from rlinkd.client_lib.policy import BoardPolicy, OnnxPolicy
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.records import concat_records, fragment_records
from rlinkd.client_lib.transport import Address, RLlinkClient, RLlinkError, parse_address
from rlinkd.shm.board import WeightsBoard
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.records import StepLayout
from rlinkd.shm.ring import StepRing

log = logging.getLogger("rlinkd.client_lib")

DEFAULT_TCP = "tcp://127.0.0.1:5555"
LocalNet = BoardPolicy | OnnxPolicy
"""What a policy acts with here: board weights (numpy/onnxruntime), or a served ONNX model."""
WRITE_TIMEOUT_S = 300.0


@dataclass
class RingAttachment:
    """One policy's ring, weights board, network and record layout on this connection."""

    ring: StepRing
    board: WeightsBoard | None  # None: a frozen model trained elsewhere, fetched by GET_STATE
    spec: PolicySpec
    layout: StepLayout

    @property
    def max_seq_len(self) -> int:
        """The fragment state grid L of a recurrent policy's records (0: feed-forward)."""
        return self.spec.max_seq_len if self.layout.state_size else 0

    def close(self) -> None:
        self.ring.close()
        if self.board is not None:
            self.board.close()


class ShmLink(ReconnectingLink):
    """Ring + board attachments with the same interface as ``TcpLink``.

    An Agent's link attaches one ring at connect (ATTACH without ``policy``: the default).
    A many-agent client's link (``open_policies``) attaches one ring per policy, each on
    first use (``policy(name)``), and re-attaches all of them after a reconnect.
    """

    def __init__(self, socket_path: str, token: str | None = None,
                 reconnect_timeout_s: float = 120.0, capacity_records: int | None = None) -> None:
        self.socket_path, self.token = socket_path, token
        self.reconnect_timeout_s, self.capacity_records = reconnect_timeout_s, capacity_records
        self.client: RLlinkClient | None = None
        self.attached: dict[str | None, RingAttachment] = {}
        self.wanted: list[str | None] = [None]  # ATTACH's policy per ring (None: the default)
        self.reconnects = 0
        self.exploration: dict | None = None  # the last WEIGHTS_READY's (DQN epsilon)

    @property
    def ring(self) -> StepRing | None:
        first = self._first()
        return first.ring if first else None

    @property
    def board(self) -> WeightsBoard | None:
        first = self._first()
        return first.board if first else None

    @property
    def layout(self) -> StepLayout:
        first = self._first()
        if first is None:
            raise ConnectionError(f"{self.socket_path}: not attached")
        return first.layout

    def _first(self) -> RingAttachment | None:
        return next(iter(self.attached.values()), None)

    # ------------------------------------------------------------ link interface
    def open(self) -> tuple[LinkConfig, BoardPolicy]:
        return self._with_retry(lambda: (self.config, self._policy(None)))

    def submit(self, fragments, seq_no: int) -> BoardPolicy | None:
        """Write the sample into the ring, ask for weights, read them from the board."""
        return self._with_retry(lambda: self._submit(fragments, seq_no, get_state=True))

    def use_spaces(self, obs_space, act_space) -> None:
        """Records carry the spaces' leaves as the daemon laid them out: nothing to do."""

    def refresh(self, seq_no: int) -> LocalNet | None:
        """The board's newest weights if newer than ``seq_no`` (no message at all), else None."""
        def read() -> LocalNet | None:
            part = self._attachment(None)
            if part.board is None or part.board.latest_seq_no() == seq_no:
                return None
            return self._policy(None)
        return self._with_retry(read)

    def send_only(self, fragments, seq_no: int) -> None:
        if self.client is not None and fragments:
            self._submit(fragments, seq_no, get_state=False)

    def describe(self) -> str:
        return self.socket_path

    def session_key(self) -> str:
        """The daemon's session id for this client (from its ring's name)."""
        name = os.path.basename(self.ring.path) if self.ring else ""
        return name.split(".client-")[-1].split("-")[0] if ".client-" in name else ""

    def close(self) -> None:
        for part in self.attached.values():
            part.close()
        self.attached = {}
        if self.client is not None:
            self.client.close()
        self.client = None

    # ------------------------------------------------------------ many policies
    def open_policies(self) -> LinkConfig:
        """Connect and handshake without attaching: rings are attached per policy, on the
        first ``policy(name)``."""
        self.wanted = []
        return self._with_retry(lambda: self.config)

    def policy(self, name: str) -> LocalNet:
        """Policy ``name``'s newest weights; attaches its ring first if needed (retrying)."""
        if name not in self.wanted:
            self.wanted.append(name)

        def attach_and_read() -> LocalNet:
            if name not in self.attached:
                self._attach(self._client(), name)
            return self._policy(name)
        return self._with_retry(attach_and_read)

    def exchange(self, sends, held: dict[str, int], get_state: bool = True) -> dict[str, LocalNet]:
        """Write each fragment into its policy's ring (``stream_id`` = its slot), then one
        SAMPLE_READY; returns the policies whose weights changed (re-sent after a reconnect).
        ``get_state`` False: written only if connected, no reply awaited, nothing returned."""
        if not get_state:
            if self.client is not None and sends:
                self._write_all(sends, held, get_state=False)
            return {}
        return self._with_retry(lambda: self._write_all(sends, held, get_state=True))

    # ------------------------------------------------------------ internals
    def _connect(self) -> None:
        client = RLlinkClient(Address("unix", path=self.socket_path)).connect()
        try:
            client.ping(self.token)
            cfg = client.get_config()
            self.config = server_config(cfg)
            for policy in self.wanted:
                self._attach(client, policy)
        except BaseException:
            self.close()
            client.close()
            raise
        self.client = client

    def _attach(self, client: RLlinkClient, policy: str | None) -> None:
        attached, ring_fd = request_ring(client, self.capacity_records, policy)
        layout = StepLayout.from_json(attached.layout)
        ring = StepRing.attach_fd(ring_fd, attached.ring_name, expected_layout=layout)
        fifo = os.open(attached.doorbell_path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        ring.doorbell = Doorbell(fifo)  # FIFO doorbell: the collector sleeps on its read end
        board = WeightsBoard.attach(attached.board_path) if attached.board_path else None
        self.attached[policy] = RingAttachment(ring, board, PolicySpec.from_json(attached.policy_spec),
                                               layout)

    def _attachment(self, policy: str | None) -> RingAttachment:
        """The policy's ring and board; ConnectionError (so ``_with_retry`` reconnects) when
        detached."""
        part = self.attached.get(policy)
        if self.client is None or part is None:
            raise ConnectionError(f"{self.socket_path}: not attached")
        return part

    def _policy(self, policy: str | None) -> LocalNet:
        part = self._attachment(policy)
        if part.board is None:
            return self._served_model(policy or DEFAULT_POLICY)
        deadline = time.monotonic() + self.reconnect_timeout_s
        while part.board.latest_seq_no() < 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # the learner is still starting
        seq, flat = part.board.read()
        return BoardPolicy(part.spec, flat, seq, codec.epsilon_of(self.exploration, policy or DEFAULT_POLICY))

    def _served_model(self, name: str) -> OnnxPolicy:
        """A policy without board weights (a frozen model trained elsewhere): its ONNX model
        from GET_STATE on our socket, run with onnxruntime. It never changes."""
        state = self._client().get_state()
        entry = (state.policies or {}).get(name) if name != DEFAULT_POLICY else None
        if entry is not None:
            state = codec.SetState(weights_seq_no=entry["weights_seq_no"],
                                   onnx_file=entry["onnx_file"], onnx_sha256=entry.get("onnx_sha256"))
        return OnnxPolicy(state)

    def _submit(self, fragments, seq_no: int, get_state: bool) -> LocalNet | None:
        part = self._attachment(None)
        records = concat_records([fragment_records(f, part.layout, 0, seq_no, part.max_seq_len)
                                  for f in fragments], part.layout.dtype)
        part.ring.write_batch(records, timeout_s=WRITE_TIMEOUT_S)
        reply = self._sample_ready(sum(f.num_steps for f in fragments), get_state)
        if reply is None:
            return None
        return self._policy(None) if reply.weights_seq_no != seq_no else None

    def _write_all(self, sends, held: dict[str, int], get_state: bool) -> dict[str, LocalNet]:
        by_policy: dict[str, list] = {}
        for slot, frag in sends:
            by_policy.setdefault(frag.policy_id or DEFAULT_POLICY, []).append((slot, frag))
        for name, pairs in by_policy.items():
            part = self._attachment(name)
            seq = held.get(name, -1)
            records = concat_records([fragment_records(f, part.layout, slot, seq, part.max_seq_len)
                                      for slot, f in pairs], part.layout.dtype)
            part.ring.write_batch(records, timeout_s=WRITE_TIMEOUT_S)
        reply = self._sample_ready(sum(f.num_steps for _, f in sends), get_state)
        if reply is None:
            return {}
        seqs = reply.weights_seq_nos or {name: reply.weights_seq_no for name in self.attached}
        return {name: self._policy(name) for name, seq in seqs.items()
                if name in self.attached and seq != held.get(name)}

    def _sample_ready(self, steps: int, get_state: bool) -> codec.WeightsReady | None:
        client = self._client()
        client.send(codec.SampleReady(env_steps=steps, get_state=get_state))
        if not get_state:
            return None
        reply = client.recv()
        if not isinstance(reply, codec.WeightsReady):
            raise ConnectionError(f"expected WEIGHTS_READY, got {reply.TYPE.value}")
        self.exploration = reply.exploration
        return reply


def request_ring(client: RLlinkClient, capacity_records: int | None = None,
                 policy: str | None = None) -> tuple[codec.Attached, int]:
    """ATTACH on a connected Unix-socket client: the ATTACHED reply and the ring's descriptor
    (``policy``: whose ring; None asks for the default without naming it).

    The caller owns the descriptor (close-on-exec; ``StepRing.attach_fd`` takes it over).
    ``ServerError`` if the daemon refuses, ``ConnectionError`` if it closes.
    """
    attached = client.request(codec.Attach(pid=os.getpid(), capacity_records=capacity_records,
                                           policy=policy), codec.Attached)
    assert client.sock is not None, "request() needs a connected client"
    return attached, receive_ring_fd(client.sock)


def receive_ring_fd(sock: socket.socket) -> int:
    """The byte after ATTACHED and the one descriptor it carries (see ``codec.Attached``).

    ``ConnectionError`` if the daemon closed; ``RLlinkError`` (descriptors closed) for
    anything but ``RING_FD_BYTE`` with exactly one descriptor.
    """
    data, fds, flags, _ = socket.recv_fds(sock, 1, 1, socket.MSG_CMSG_CLOEXEC)
    if not data:
        raise ConnectionError("daemon closed the connection before sending the ring")
    if data != codec.RING_FD_BYTE or len(fds) != 1 or flags & socket.MSG_CTRUNC:
        for fd in fds:
            os.close(fd)
        raise RLlinkError(f"expected the ring descriptor after ATTACHED, got {data!r} with {len(fds)} fds")
    return fds[0]


def open_local_link(address: str, token: str | None = None, reconnect_timeout_s: float = 120.0,
                    capacity_records: int | None = None):
    """``shm``, ``shm:<state_dir>``, ``auto``, ``auto:<state_dir>`` or ``unix:///path`` → a link."""
    ep = parse_endpoint(address)
    if ep.kind in ("unix", "shm-socket"):
        return ShmLink(ep.path, token, reconnect_timeout_s, capacity_records)
    if ep.kind not in LOCAL_KINDS:
        raise ValueError(f"{address!r}: not a shared-memory address")
    socket_path = find_socket(ep)
    if socket_path is None and ep.kind.startswith("auto"):
        return TcpLink(parse_address(DEFAULT_TCP), token=token,
                       reconnect_timeout_s=reconnect_timeout_s)
    deadline = time.monotonic() + reconnect_timeout_s
    if socket_path is None:
        log.warning("no running rlinkd in state dir %s yet (no daemon.json naming a live daemon); "
                    "waiting up to %g s", ep.path or default_state_dir(), reconnect_timeout_s)
    while socket_path is None and time.monotonic() < deadline:  # the daemon may be starting
        time.sleep(0.1)
        socket_path = find_socket(ep)
    if socket_path is None:
        raise ConnectionError(f"no running rlinkd found in state dir {ep.path or default_state_dir()}")
    return ShmLink(socket_path, token, reconnect_timeout_s, capacity_records)



__all__ = ["ShmLink", "open_local_link", "request_ring"]
