"""RLlinkClient: the RLlink protocol over a blocking TCP or Unix-domain socket.

The bottom layer of client_lib. It shares the sans-IO codec with the server, sends
each message with one ``sendall`` (TCP_NODELAY on), and turns an ERROR reply into
``ServerError``. Addresses: ``tcp://host:port``, ``host:port``, ``unix:///path``.
"""
from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlparse

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol.addresses import parse_endpoint
from rlinkd.client_lib.protocol.codec import Message

ReplyT = TypeVar("ReplyT", bound=Message)

DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024


class RLlinkError(Exception):
    """Base of client-side errors."""


EVICTED = "evicted:"
"""Start of the ERROR a daemon sends a connection it evicts during its handshake."""
EPISODE_LOST = "episode lost:"
DIRECT_REFUSED = "direct serving refused:"
"""Start of the ERROR the inference process sends a handed-over connection it has no room
for (``server.max_connections``): the client reconnects later."""
SHUTTING_DOWN = "daemon shutting down"
"""Start of the ERROR every client gets when the daemon stops (the collector's drain, the
inference role's serving connections)."""
RETRYABLE_ERRORS = (SHUTTING_DOWN, EVICTED, EPISODE_LOST, DIRECT_REFUSED)
"""Starts of ERROR messages worth a reconnect: the daemon is stopping (it may come back),
this connection was evicted in its handshake by a flood of newer ones, or its episode or
its direct serving is gone."""


class ServerError(RLlinkError):
    """The server answered ERROR. ``retry`` is True for the ``RETRYABLE_ERRORS``."""

    def __init__(self, message: str, retry: bool = False) -> None:
        super().__init__(message)
        self.retry = retry


@dataclass(frozen=True)
class Address:
    kind: str          # "tcp" | "unix"
    host: str = ""
    port: int = 0
    path: str = ""

    def __str__(self) -> str:
        return f"unix://{self.path}" if self.kind == "unix" else f"tcp://{self.host}:{self.port}"


def parse_address(text: str, default_port: int = 5555) -> Address:
    """``tcp://h:p`` | ``h:p`` | ``unix:///path`` → Address; ValueError when unusable (the
    grammar: ``protocol.addresses``; its shared-memory forms are not stream addresses)."""
    ep = parse_endpoint(text)
    if ep.kind == "unix":
        return Address("unix", path=ep.path)
    if ep.kind not in ("tcp", "tls"):
        raise ValueError(f"{text!r}: expected tcp://HOST:PORT, HOST:PORT or unix:///PATH")
    explicit = urlparse(text if "://" in text else f"tcp://{text}").port is not None
    return Address(ep.kind, host=ep.host, port=ep.port if explicit else default_port)


class RLlinkClient:
    """One connection. Not thread-safe; one request at a time."""

    def __init__(self, address: Address | str, timeout_s: float | None = 120.0,
                 ssl_context: ssl.SSLContext | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.address = parse_address(address) if isinstance(address, str) else address
        self.timeout_s = timeout_s
        self.ssl_context = ssl_context
        self.max_message_bytes = max_message_bytes
        self.sock: socket.socket | None = None

    def connect(self) -> RLlinkClient:
        if self.address.kind == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout_s)
            sock.connect(self.address.path)
        else:
            sock = socket.create_connection((self.address.host, self.address.port), self.timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.ssl_context is not None:
                sock = self.ssl_context.wrap_socket(sock, server_hostname=self.address.host)
        self.sock = sock
        return self

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def __enter__(self) -> RLlinkClient:
        return self if self.sock else self.connect()

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ raw I/O
    def send(self, msg: Message) -> None:
        self._require().sendall(codec.encode(msg))

    def recv(self) -> Message:
        """Next message; ServerError for ERROR, ConnectionError when the server closed."""
        header = self._read_exactly(codec.HEADER_BYTES)
        body = self._read_exactly(codec.parse_header(header, self.max_message_bytes))
        msg = codec.decode_body(body)
        if isinstance(msg, codec.Error):
            raise ServerError(msg.message, retry=msg.message.startswith(RETRYABLE_ERRORS))
        return msg

    def request(self, msg: Message, expect: type[ReplyT]) -> ReplyT:
        self.send(msg)
        reply = self.recv()
        if not isinstance(reply, expect):
            raise RLlinkError(f"expected {expect.__name__}, got {reply.TYPE.value}")
        return reply

    def _read_exactly(self, n: int) -> bytes:
        sock, buf = self._require(), bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = sock.recv_into(view[got:])
            if k == 0:
                raise ConnectionError("server closed the connection")
            got += k
        return bytes(buf)

    def _require(self) -> socket.socket:
        if self.sock is None:
            raise ConnectionError("not connected")
        return self.sock

    # ------------------------------------------------------------ protocol verbs
    def ping(self, token: str | None = None) -> None:
        self.request(codec.Ping(token=token), codec.Pong)

    def get_config(self) -> codec.SetConfig:
        return self.request(codec.GetConfig(), codec.SetConfig)

    def get_state(self) -> codec.SetState:
        return self.request(codec.GetState(), codec.SetState)

    def episodes(self, fragments, weights_seq_no: int | None = None,
                 weights_seq_nos: dict | None = None) -> None:
        self.send(codec.Episodes(tuple(fragments), weights_seq_no=weights_seq_no,
                                 weights_seq_nos=weights_seq_nos))

    def episodes_and_get_state(self, fragments, weights_seq_no: int | None = None,
                               weights_seq_nos: dict | None = None) -> codec.SetState:
        return self.request(codec.EpisodesAndGetState(tuple(fragments), weights_seq_no=weights_seq_no,
                                                      weights_seq_nos=weights_seq_nos),
                            codec.SetState)

    def status(self, token: str | None = None) -> dict:
        return self.request(codec.Status(token=token), codec.StatusReport).status
