"""Raw-byte fuzzing of direct.c's plain-step grammar, differential against the Python path.

Cases run on a connection the native path owns (one open episode; a new connection when a
case closed it) and send bytes
drawn from the committed corpus (tests/native/corpus/direct/: whole frames) by byte-level
mutations -- any byte value, insertions, deletions, duplicated and spliced ranges,
truncations -- with the length header fixed up or not, in one write or split in two. Both
``DirectConnections`` (native on, native off) must end with the same replies, lane writes
and open connections (``Pair.check``). `make native-check` runs this file against the
AddressSanitizer/UndefinedBehaviorSanitizer build (tests/native/run_sanitized.py).

Bounded: cases run in a fixed order (case k draws from ``random.Random(k)``) until
``RLINKD_FUZZ_SECONDS`` (default 2) have passed; a failure names its case.
"""
from __future__ import annotations

import os
import random
import socket
import time

from tests.helpers import REPO
from tests.unit.test_direct_native import Pair, needs_native, start

CORPUS = sorted((REPO / "tests" / "native" / "corpus" / "direct").glob("*.bin"))
SECONDS = float(os.environ.get("RLINKD_FUZZ_SECONDS", "2"))
MIN_CASES = 50  # (even on a slow host: a run that checked almost nothing is no evidence)


def mutate(rng: random.Random, seeds: list[bytes]) -> bytes:
    """One input: a corpus body after 0-4 byte-level mutations, framed with its length (or,
    one time in five, a whole mutated frame; one in twenty, random bytes)."""
    roll = rng.random()
    if roll < 0.05:
        return rng.randbytes(rng.randrange(1, 64))
    whole = roll < 0.25
    data = bytearray(rng.choice(seeds) if whole else rng.choice(seeds)[8:])
    for _ in range(rng.choice((0, 1, 1, 2, 2, 3, 4))):
        at = rng.randrange(len(data) + 1)
        op = rng.randrange(6)
        if op == 0 and at < len(data):
            data[at] = rng.randrange(256)
        elif op == 1:
            data[at:at] = rng.randbytes(rng.randrange(1, 9))
        elif op == 2:
            del data[at:at + rng.randrange(1, 9)]
        elif op == 3:
            data[at:at] = data[at:at + rng.randrange(1, 17)]
        elif op == 4:
            other = rng.choice(seeds)[8:]
            data[at:] = other[rng.randrange(len(other) + 1):]
        else:
            del data[max(at, 1):]
    return bytes(data) if whole else b"%08d" % len(data) + bytes(data)


def fresh_connections(pair: Pair) -> None:
    """A new client connection on both sides (the last one was closed), its episode started."""
    for side in (pair.native, pair.python):
        side.client.close()
        ours, theirs = socket.socketpair()
        side.d.add(theirs.detach())
        side.client, side.received = ours, b""
        ours.setblocking(False)
    pair.send(start("a"), [])


def run_case(pair: Pair, k: int, seeds: list[bytes]) -> None:
    """Case ``k`` on the pair's connection (a new one when the last case closed it)."""
    rng = random.Random(k)
    data = mutate(rng, seeds)
    if not (pair.native.d.conns and pair.python.d.conns):
        fresh_connections(pair)
    cut = rng.randrange(len(data) + 1) if rng.random() < 0.3 else len(data)
    try:
        pair.send(data[:cut], [], turns=1)
        if cut < len(data):
            pair.send(data[cut:], [], turns=2)
        pair.check()
    except AssertionError as exc:
        raise AssertionError(f"case {k}: input {data!r}") from exc


def test_the_corpus_is_there():
    assert len(CORPUS) >= 5


@needs_native
def test_raw_bytes_native_and_python_paths_agree(tmp_path):
    seeds = [p.read_bytes() for p in CORPUS]
    pair = Pair(tmp_path)
    deadline = time.monotonic() + SECONDS
    k = 0
    try:
        pair.send(start("a"), [])
        while k < MIN_CASES or time.monotonic() < deadline:
            run_case(pair, k, seeds)
            k += 1
    finally:
        pair.close()
    assert pair.native.d.counts["direct_native_messages"] > 0  # (the grammar was reached)
