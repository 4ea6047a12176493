"""The address grammar both clients follow (this module and client_lib/c/src/rlk_addr.c).

Both are checked against one table of cases, ``client_lib/c/tests/addresses.tsv``; the
human table is in docs/c-client.md ("Addresses").

- ``tcp://HOST:PORT``, ``tcp://HOST``, ``HOST:PORT``, ``HOST``: TCP (port 5555 when left out).
- ``tls://HOST:PORT``: TLS (the C client refuses it).
- ``unix:///PATH``: the daemon's Unix socket at PATH.
- ``shm``, ``shm:DIR``, ``shm:///DIR``: shared memory with the daemon of state directory DIR
  (default: ``discovery.default_state_dir()``), found through ``DIR/daemon.json``.
- ``shm:///PATH.sock``, ``shm:PATH.sock``: shared memory through the Unix socket PATH.sock.
- ``auto``, ``auto:DIR``, ``auto:PATH.sock``: as ``shm`` when that daemon runs on this host,
  else ``tcp://127.0.0.1:5555``.

A path after ``shm:`` / ``auto:`` names a socket when it ends in ``.sock``, else a state dir.
"""
from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlparse

DEFAULT_PORT = 5555
LOCAL_KINDS = ("shm-socket", "shm-state", "auto-socket", "auto-state")


@dataclass(frozen=True)
class Endpoint:
    """A parsed address. ``kind``: "tcp", "tls", "unix" or one of ``LOCAL_KINDS``; ``path``:
    the socket (unix, *-socket) or the state dir (*-state; "" = the default)."""

    kind: str
    host: str = ""
    port: int = 0
    path: str = ""

    def describe(self) -> str:
        """The canonical form the shared cases compare ("tcp HOST PORT", "shm-state DIR|-", ...)."""
        if self.kind in ("tcp", "tls"):
            return f"{self.kind} {self.host} {self.port}"
        return f"{self.kind} {self.path or '-'}"


def parse_endpoint(text: str) -> Endpoint:
    """``text`` by the grammar above; ValueError (naming the address) when it fits no form."""
    if text in ("shm", "auto"):
        return Endpoint(f"{text}-state")
    scheme, colon, where = text.partition(":")
    if colon and scheme in ("shm", "auto"):
        path = where[2:] if where.startswith("//") else where
        if not path:
            raise ValueError(f"{text!r}: want shm, shm:STATE_DIR or shm:///PATH.sock")
        return Endpoint(f"{scheme}-{'socket' if path.endswith('.sock') else 'state'}", path=path)
    if text.startswith("unix://"):
        if not text[len("unix://"):]:
            raise ValueError(f"{text!r}: unix:// needs a socket path")
        return Endpoint("unix", path=text[len("unix://"):])
    url = urlparse(text if "://" in text else f"tcp://{text}")
    if url.scheme not in ("tcp", "tls") or not url.hostname:
        raise ValueError(f"{text!r}: expected tcp://HOST:PORT, HOST:PORT, unix:///PATH, shm or shm:STATE_DIR")
    port = url.port  # ValueError when out of range or not a number; 0 is a port (bind: pick one)
    return Endpoint(url.scheme, host=url.hostname, port=DEFAULT_PORT if port is None else port)


def is_local(text: str) -> bool:
    """Whether ``text`` is a shared-memory form (``shm``/``auto``, with or without a path)."""
    return text in ("shm", "auto") or text.startswith(("shm:", "auto:"))
