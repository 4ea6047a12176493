"""WeightsBoard: publish/read, spec JSON, header checks, no torn reads under a concurrent writer."""

import json
import multiprocessing as mp
import os
import threading
import time

import numpy as np
import pytest

from rlinkd.shm.board import BOARD_HEADER, WeightsBoard
from rlinkd.shm.errors import LayoutError
from tests.unit.shm_helpers import set_header_field

SPAWN = mp.get_context("spawn")
SPEC = json.dumps({"arch": "mlp", "hidden": [64, 64], "note": "é"}).encode("utf-8")


@pytest.fixture
def board(shm_dir):
    board = WeightsBoard.create(os.path.join(shm_dir, "board"), 1000, SPEC)
    yield board
    board.close()


def test_before_the_first_publish(board):
    assert board.latest_seq_no() == -1
    seq_no, weights = board.read()
    assert seq_no == -1 and weights.shape == (1000,) and not weights.any()
    assert board.spec_json() == SPEC


def test_publish_then_read_from_another_mapping(board):
    reader = WeightsBoard.attach(board.path)
    for seq_no in (0, 1, 5):
        board.publish(seq_no, np.full(1000, seq_no + 0.5, np.float64))
        out = np.empty(1000, np.float32)
        assert reader.read(out)[0] == seq_no and reader.latest_seq_no() == seq_no
        assert (out == seq_no + 0.5).all()
    assert reader.spec_json() == SPEC and reader.n_params == 1000
    reader.close()


def test_wrong_sizes_are_refused(board, shm_dir):
    with pytest.raises(ValueError, match="publish got 999 params"):
        board.publish(1, np.zeros(999, np.float32))
    with pytest.raises(ValueError, match=r"out must be float32\[1000\]"):
        board.read(np.empty(1000, np.float64))
    with pytest.raises(ValueError, match="at most 16384"):
        WeightsBoard.create(os.path.join(shm_dir, "big"), 10, b'"' + b"x" * 16384 + b'"')
    with pytest.raises(ValueError, match="not UTF-8 JSON"):
        WeightsBoard.create(os.path.join(shm_dir, "notjson"), 10, b"{nope")


@pytest.mark.parametrize("index, value, message", [
    (0, b"RLKRING1", r"bad magic b'RLKRING1' in .*/board: not an rlinkd weights board"),
    (1, 2, r"layout_version mismatch in .*/board: header has 2, expected 1"),
    (3, 2000, r"file size .* mismatch in .*/board: header has 24576, expected 32512"),
    (4, 0, r"writer_pid 0 in .*/board: header was never completed"),
])
def test_attach_refuses_bad_headers(board, index, value, message):
    set_header_field(board.segment, BOARD_HEADER, index, value)
    with pytest.raises(LayoutError, match=message):
        WeightsBoard.attach(board.path)


# ---------------------------------------------------------------- torn reads

N_PARAMS = 1 << 17  # 512 KiB per buffer: a copy takes long enough to overlap publishes
PUBLISHES = 1200


def uniform_writer(path, reader_progress):
    """Child: publish buffers filled entirely with k, as weights_seq_no k, for k = 1..PUBLISHES.

    Stays at most two publishes ahead of the reader so that reads and writes
    keep overlapping (an unpaced writer would starve the reader, which only
    retries, until the writer stops).
    """
    board = WeightsBoard.attach(path)
    flat = np.empty(N_PARAMS, np.float32)
    deadline = time.monotonic() + 60
    for k in range(1, PUBLISHES + 1):
        flat.fill(k)
        board.publish(k, flat)
        while reader_progress.value < k - 2:
            if time.monotonic() > deadline:
                raise SystemExit(f"reader stuck at {reader_progress.value}")
    board.close()


def read_until_last_publish(board, reader_progress, deadline_s):
    """Read continuously; return the distinct seq numbers seen.  Asserts every copy is whole."""
    out = np.empty(2 * N_PARAMS, np.float32)[::2]  # strided: a slower copy widens the race window
    seen, previous = set(), -1
    deadline = time.monotonic() + deadline_s
    while previous < PUBLISHES:
        assert time.monotonic() < deadline, f"writer stalled at {previous}"
        seq_no, _ = board.read(out)
        low, high = out.min(), out.max()
        assert low == high, f"torn read: values {low}..{high} in one copy"
        assert (seq_no == -1 and high == 0) or high == seq_no, f"seq_no {seq_no} labels data {high}"
        assert seq_no >= previous, f"seq_no went backwards {previous} -> {seq_no}"
        previous = reader_progress.value = seq_no
        seen.add(seq_no)
    return seen


def test_no_torn_read_under_a_concurrent_writer_process(shm_dir):
    board = WeightsBoard.create(os.path.join(shm_dir, "torn"), N_PARAMS, b"{}")
    reader_progress = SPAWN.Value("q", -1, lock=False)
    writer = SPAWN.Process(target=uniform_writer, args=(board.path, reader_progress), daemon=True)
    writer.start()
    try:
        seen = read_until_last_publish(board, reader_progress, deadline_s=60)
    finally:
        writer.join(30)
        writer.terminate()
    assert writer.exitcode == 0
    assert len(seen) > PUBLISHES // 10, f"reads barely overlapped the writer: saw {len(seen)} versions"
    board.close()


def test_readers_in_threads_never_block_the_writer(board):
    stop = threading.Event()
    failures = []

    def reader():
        out = np.empty(1000, np.float32)
        while not stop.is_set():
            seq_no, _ = board.read(out)
            if seq_no >= 0 and not (out == seq_no).all():
                failures.append(seq_no)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for thread in threads:
        thread.start()
    for k in range(2000):
        board.publish(k, np.full(1000, k, np.float32))
    stop.set()
    for thread in threads:
        thread.join()
    assert failures == [] and board.latest_seq_no() == 1999
