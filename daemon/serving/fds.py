"""Handing file descriptors to the Unix-socket peer of an asyncio stream (SCM_RIGHTS), after
every frame written before them: the collector's ATTACHED ring and SERVE_ATTACHED lane area;
and waiting until a stream's writes are all in the kernel (before a socket changes hands)."""
from __future__ import annotations

import asyncio
import os
import socket

from rlinkd.client_lib.protocol import codec


async def send_fds(writer: asyncio.StreamWriter, fds: list[int], timeout_s: float) -> None:
    """Hand ``fds`` to the Unix-socket peer of ``writer``: one ``codec.RING_FD_BYTE`` with the
    descriptors as SCM_RIGHTS, after everything written before it.

    Waits (up to ``timeout_s``, else ``asyncio.TimeoutError``) until asyncio's write buffer
    is empty, so the byte cannot overtake an earlier frame. ``ConnectionError`` if the
    peer's socket buffer is full (a client that does not read).
    """
    await empty_write_buffer(writer, timeout_s)
    with socket.socket(fileno=os.dup(writer.get_extra_info("socket").fileno())) as sock:
        try:
            socket.send_fds(sock, [codec.RING_FD_BYTE], fds)
        except BlockingIOError as exc:
            raise ConnectionError("client does not read: its ring descriptor cannot be sent") from exc


async def empty_write_buffer(writer: asyncio.StreamWriter, timeout_s: float) -> None:
    """Until everything written to ``writer`` is in the kernel (``asyncio.TimeoutError``
    after ``timeout_s``): what follows on the socket, whoever writes it, comes after."""
    if not writer.transport.get_write_buffer_size():
        return
    writer.transport.set_write_buffer_limits(high=0)  # drain() now waits for an empty buffer
    try:
        await asyncio.wait_for(writer.drain(), timeout_s)
    finally:
        writer.transport.set_write_buffer_limits()
