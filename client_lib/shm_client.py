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

import os
import socket
import time

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.links import LinkConfig, ReconnectingLink, TcpLink, server_config
from rlinkd.client_lib.protocol.discovery import local_socket
from rlinkd.client_lib.policy import BoardPolicy
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.records import concat_records, fragment_records
from rlinkd.client_lib.transport import Address, RLlinkClient, RLlinkError, parse_address
from rlinkd.shm.board import WeightsBoard
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.records import StepLayout
from rlinkd.shm.ring import StepRing

DEFAULT_TCP = "tcp://127.0.0.1:5555"
WRITE_TIMEOUT_S = 300.0


class ShmLink(ReconnectingLink):
    """A ring + board attachment with the same interface as ``TcpLink``."""

    def __init__(self, socket_path: str, token: str | None = None,
                 reconnect_timeout_s: float = 120.0, capacity_records: int | None = None) -> None:
        self.socket_path, self.token = socket_path, token
        self.reconnect_timeout_s, self.capacity_records = reconnect_timeout_s, capacity_records
        self.client: RLlinkClient | None = None
        self.ring: StepRing | None = None
        self.board: WeightsBoard | None = None
        self.reconnects = 0

    # ------------------------------------------------------------ link interface
    def open(self) -> tuple[LinkConfig, BoardPolicy]:
        return self._with_retry(lambda: (self.config, self._policy()))

    def submit(self, fragments, seq_no: int) -> BoardPolicy | None:
        """Write the sample into the ring, ask for weights, read them from the board."""
        return self._with_retry(lambda: self._submit(fragments, seq_no, get_state=True))

    def use_spaces(self, obs_space, act_space) -> None:
        """Records carry the spaces' leaves as the daemon laid them out: nothing to do."""

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
        for part in (self.ring, self.board, self.client):
            if part is not None:
                part.close()
        self.ring = self.board = self.client = None

    # ------------------------------------------------------------ internals
    def _connect(self) -> None:
        client = RLlinkClient(Address("unix", path=self.socket_path)).connect()
        client.ping(self.token)
        cfg = client.get_config()
        attached, ring_fd = request_ring(client, self.capacity_records)
        layout = StepLayout.from_json(attached.layout)
        self.ring = StepRing.attach_fd(ring_fd, attached.ring_name, expected_layout=layout)
        fifo = os.open(attached.doorbell_path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self.ring.doorbell = Doorbell(fifo)  # FIFO doorbell: the collector sleeps on its read end
        self.board = WeightsBoard.attach(attached.board_path)
        self.spec = PolicySpec.from_json(attached.policy_spec)
        self.layout = layout
        self.config = server_config(cfg)
        self.client = client

    def _attached(self) -> tuple[RLlinkClient, StepRing, WeightsBoard]:
        """Socket, ring and board; ConnectionError (so ``_with_retry`` reconnects) when detached."""
        if self.client is None or self.ring is None or self.board is None:
            raise ConnectionError(f"{self.socket_path}: not attached")
        return self.client, self.ring, self.board

    def _policy(self) -> BoardPolicy:
        board = self._attached()[2]
        deadline = time.monotonic() + self.reconnect_timeout_s
        while board.latest_seq_no() < 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # the learner is still starting
        seq, flat = board.read()
        return BoardPolicy(self.spec, flat, seq)

    def _submit(self, fragments, seq_no: int, get_state: bool) -> BoardPolicy | None:
        client, ring, _ = self._attached()
        records = concat_records([fragment_records(f, self.layout, 0, seq_no) for f in fragments],
                                 self.layout.dtype)
        ring.write_batch(records, timeout_s=WRITE_TIMEOUT_S)
        steps = sum(f.num_steps for f in fragments)
        client.send(codec.SampleReady(env_steps=steps, get_state=get_state))
        if not get_state:
            return None
        reply = client.recv()
        if not isinstance(reply, codec.WeightsReady):
            raise ConnectionError(f"expected WEIGHTS_READY, got {reply.TYPE.value}")
        return self._policy() if reply.weights_seq_no != seq_no else None


def request_ring(client: RLlinkClient, capacity_records: int | None = None) -> tuple[codec.Attached, int]:
    """ATTACH on a connected Unix-socket client: the ATTACHED reply and the ring's descriptor.

    The caller owns the descriptor (close-on-exec; ``StepRing.attach_fd`` takes it over).
    ``ServerError`` if the daemon refuses, ``ConnectionError`` if it closes.
    """
    attached = client.request(codec.Attach(pid=os.getpid(), capacity_records=capacity_records),
                              codec.Attached)
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
    kind, _, where = address.partition(":")
    if address.startswith("unix://"):
        return ShmLink(parse_address(address).path, token, reconnect_timeout_s, capacity_records)
    socket_path = local_socket(where or None)
    if socket_path is None and kind == "auto":
        return TcpLink(parse_address(DEFAULT_TCP), token=token,
                       reconnect_timeout_s=reconnect_timeout_s)
    deadline = time.monotonic() + reconnect_timeout_s
    while socket_path is None and time.monotonic() < deadline:  # the daemon may be starting
        time.sleep(0.1)
        socket_path = local_socket(where or None)
    if socket_path is None:
        raise ConnectionError(f"no running rlinkd found in state dir {where or '(default)'}")
    return ShmLink(socket_path, token, reconnect_timeout_s, capacity_records)


__all__ = ["ShmLink", "open_local_link", "request_ring"]
