"""serving.deadlines: the one rule both owners of a serving socket apply."""
from __future__ import annotations

import pytest

from rlinkd.daemon.config import ServerConfig
from rlinkd.daemon.serving.deadlines import Deadlines

LIMITS = Deadlines(idle_s=30.0, read_s=5.0)


@pytest.mark.parametrize("now, last_seen, frame_since, out_since, busy, reason", [
    (100.0, 99.0, 0.0, 0.0, False, None),                  # quiet, within every limit
    (100.0, 99.0, 94.0, 0.0, False, "a frame incomplete past server.read_timeout_s"),
    (100.0, 99.0, 94.0, 0.0, True, None),                  # its request in flight: no read clock
    (100.0, 99.0, 0.0, 94.0, True, "a reply unread past server.read_timeout_s"),
    (100.0, 69.0, 0.0, 0.0, False, "idle past server.idle_timeout_s"),
    (100.0, 69.0, 0.0, 0.0, True, None),                   # busy is not idle
])
def test_overdue_names_the_limit_a_connection_is_past(now, last_seen, frame_since, out_since, busy, reason):
    assert LIMITS.overdue(now, last_seen, frame_since, out_since, busy) == reason


def test_no_idle_limit_when_idle_timeout_is_0_and_the_limits_come_from_server():
    limits = Deadlines.of(ServerConfig(idle_timeout_s=0.0, read_timeout_s=7.0))
    assert limits.first_byte_s is None and limits.frame_s == limits.reply_s == 7.0
    assert limits.overdue(1e6, 0.0, 0.0, 0.0, False) is None
