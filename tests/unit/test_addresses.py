"""The address grammar: client_lib's parser passes every case of the table the C client's
tests read too (client_lib/c/tests/addresses.tsv), so both clients accept the same forms
with the same meaning."""
from __future__ import annotations

from pathlib import Path

import pytest

from rlinkd.client_lib.protocol.addresses import parse_endpoint
from rlinkd.client_lib.transport import parse_address

TABLE = Path(__file__).resolve().parents[2] / "client_lib" / "c" / "tests" / "addresses.tsv"


def cases() -> list[tuple[str, str]]:
    rows = [line.split("\t") for line in TABLE.read_text().splitlines() if not line.startswith("#")]
    return [(address, meaning) for address, meaning in rows]


def describe(address: str) -> str:
    try:
        return parse_endpoint(address).describe()
    except ValueError:
        return "error"


@pytest.mark.parametrize("address,meaning", cases())
def test_every_shared_case(address, meaning):
    assert describe(address) == meaning


def test_the_table_covers_every_kind():
    kinds = {meaning.split()[0] for _, meaning in cases()}
    assert kinds == {"tcp", "tls", "unix", "shm-socket", "shm-state", "auto-socket", "auto-state", "error"}


def test_stream_addresses_refuse_the_shared_memory_forms():
    assert str(parse_address("127.0.0.1:7000")) == "tcp://127.0.0.1:7000"
    assert parse_address("localhost", default_port=6000).port == 6000
    with pytest.raises(ValueError, match="shm:/var"):
        parse_address("shm:/var/lib/rlinkd")
