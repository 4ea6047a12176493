"""`rlinkd demo --transport tcp|shm|mixed`: which address each demo client connects to (the
demo's only transport logic; the shared-memory CLI client itself plays and survives kills in
the chaos run, tests/process/test_reliability_ci.py, and `demo` end to end in test_demo.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from rlinkd.daemon.demo import client_address

INFO = {"port": 4321}
STATE = Path("/tmp/state")


@pytest.mark.parametrize("transport, want", [
    ("tcp", ["tcp", "tcp", "tcp", "tcp"]),
    ("shm", ["shm", "shm", "shm", "shm"]),
    ("mixed", ["tcp", "shm", "tcp", "shm"]),
])
def test_each_demo_client_connects_by_the_chosen_transport(transport, want):
    addresses = [client_address(i, transport, INFO, STATE) for i in range(4)]
    assert [a.split(":", 1)[0] for a in addresses] == want
    assert {a for a in addresses if a.startswith("tcp")} <= {"tcp://127.0.0.1:4321"}
    assert {a for a in addresses if a.startswith("shm")} <= {f"shm:{STATE}"}
