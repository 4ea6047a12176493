"""A link that cannot reach its daemon says at once what it waits for and for how long, and a
link that never connected is told apart from one that lost its connection (issue: `rlinkd
client` with no daemon printed nothing for 120 s, then "gave up reconnecting")."""
from __future__ import annotations

import logging
import socket

import pytest

from rlinkd.client_lib.links import TcpLink
from rlinkd.client_lib.transport import parse_address


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_link_that_never_connected_says_so_at_once_and_at_the_end(caplog):
    address = f"tcp://127.0.0.1:{closed_port()}"
    link = TcpLink(parse_address(address), reconnect_timeout_s=0.3)
    with caplog.at_level(logging.WARNING, logger="rlinkd.client_lib"), \
            pytest.raises(ConnectionError) as raised:
        link.open()
    waits = [r.getMessage() for r in caplog.records]
    assert len(waits) == 1, waits  # once, at the first failure
    assert "127.0.0.1" in waits[0] and "cannot connect yet" in waits[0] and "up to 0.3 s" in waits[0]
    assert "could not connect within 0.3 s" in str(raised.value)
    assert "gave up reconnecting" not in str(raised.value)


def test_a_link_that_was_connected_gives_up_reconnecting(caplog):
    link = TcpLink(parse_address(f"tcp://127.0.0.1:{closed_port()}"), reconnect_timeout_s=0.2)
    link.connected_once = True  # (as after a connection that was lost)
    with caplog.at_level(logging.WARNING, logger="rlinkd.client_lib"), \
            pytest.raises(ConnectionError, match=r"gave up reconnecting after 0\.2 s"):
        link.open()
    assert "reconnecting" in caplog.records[0].getMessage()
