"""daemon.tboard: CRC-32C, TFRecord framing, hand-encoded Event protobufs, writer/reader."""
from __future__ import annotations

import math
import os
import random
import re
import socket
import stat
import struct
import time

import numpy as np
import pytest

from rlinkd.daemon import tboard
from rlinkd.daemon.tboard import EventWriter, crc32c, encode_event, frame_record, masked_crc, read_events


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def crc32c_bitwise(data: bytes) -> int:
    """Reference: bit-at-a-time CRC-32C, the non-reflected polynomial 0x1EDC6F41 run on
    bit-reversed bytes (an independent derivation of the table-driven version)."""
    def rev(x: int, bits: int) -> int:
        return int(f"{x:0{bits}b}"[::-1], 2)
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= rev(byte, 8) << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1EDC6F41 if crc & 0x80000000 else crc << 1) & 0xFFFFFFFF
    return rev(crc, 32) ^ 0xFFFFFFFF


# --- CRC ------------------------------------------------------------------------------------

@pytest.mark.parametrize("data, expected", [
    (b"123456789", 0xE3069283),
    (b"", 0),
    # RFC 3720 (iSCSI) appendix B.4 test vectors
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
])
def test_crc32c_vectors(data, expected):
    assert crc32c(data) == expected
    assert crc32c_bitwise(data) == expected


def test_crc32c_matches_bitwise_reference_on_random_data():
    rng = random.Random(1234)
    for size in (1, 2, 3, 7, 8, 63, 64, 257, 1000):
        data = bytes(rng.getrandbits(8) for _ in range(size))
        assert crc32c(data) == crc32c_bitwise(data), size


def test_masked_crc():
    assert masked_crc(0) == 0xA282EAD8
    assert masked_crc(1) == (1 << 17) + 0xA282EAD8
    assert masked_crc(1 << 15) == 1 + 0xA282EAD8
    # rotation wraps, the sum overflows mod 2**32
    assert masked_crc(0xFFFFFFFF) == (0xFFFFFFFF + 0xA282EAD8) - (1 << 32)
    c = 0xE3069283
    assert masked_crc(c) == ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) % (1 << 32)


# --- framing and encoding ----------------------------------------------------------------

def test_frame_record_layout():
    data = b"hello event"
    rec = frame_record(data)
    assert len(rec) == 8 + 4 + len(data) + 4
    assert rec[:8] == struct.pack("<Q", len(data))
    assert struct.unpack("<I", rec[8:12])[0] == masked_crc(crc32c_bitwise(rec[:8]))
    assert rec[12:-4] == data
    assert struct.unpack("<I", rec[-4:])[0] == masked_crc(crc32c_bitwise(data))


def test_frame_empty_record():
    zero_len = bytes(8)
    assert frame_record(b"") == zero_len + struct.pack(
        "<II", masked_crc(crc32c_bitwise(zero_len)), masked_crc(0))
    assert masked_crc(0) == 0xA282EAD8


def test_encode_file_version_event_bytes():
    got = encode_event(1.5, file_version="brain.Event:2")
    assert got == b"\x09" + struct.pack("<d", 1.5) + b"\x1a\x0dbrain.Event:2"


def test_encode_scalar_event_bytes():
    got = encode_event(2.0, step=300, scalars={"a": 0.5, "bc": -1.0})
    value_a = b"\x0a\x01a" + b"\x15" + struct.pack("<f", 0.5)            # 8 bytes
    value_bc = b"\x0a\x02bc" + b"\x15" + struct.pack("<f", -1.0)         # 9 bytes
    summary = b"\x0a\x08" + value_a + b"\x0a\x09" + value_bc               # 21 bytes
    assert got == (b"\x09" + struct.pack("<d", 2.0)
                   + b"\x10\xac\x02"                                        # 300 as varint
                   + b"\x2a\x15" + summary)


def test_encode_negative_step_is_ten_byte_varint():
    got = encode_event(0.0, step=-1)
    assert got[9:] == b"\x10" + b"\xff" * 9 + b"\x01"
    assert tboard.decode_event(got) == {"wall_time": 0.0, "step": -1}


def test_encode_saturates_beyond_float32():
    ev = tboard.decode_event(encode_event(0.0, step=1, scalars={"big": 1e300, "neg": -1e300}))
    assert ev["scalars"] == {"big": math.inf, "neg": -math.inf}


def test_long_tag_uses_multibyte_length():
    tag = "t" * 200
    ev = tboard.decode_event(encode_event(3.0, step=2**40, scalars={tag: 7.25}))
    assert ev == {"wall_time": 3.0, "step": 2**40, "scalars": {tag: 7.25}}


# --- writer / reader round trip ------------------------------------------------------------

def test_round_trip(tmp_path):
    logdir = tmp_path / "tb" / "run1"
    with EventWriter(logdir) as w:
        w.add_scalars(0, {"loss": 0.1, "reward/mean": 12.34567}, wall_time=1000.25)
        w.add_scalars(5, {"loss": 0.05, "skip_nan": float("nan"), "skip_none": None,
                          "skip_str": "x", "np": np.float32(2.5), "int": 7, "inf": math.inf},
                      wall_time=1001.5)
        w.add_scalars(10, {"loss": -3.0})
    files = list(logdir.iterdir())
    assert files == [w.path]
    events = read_events(w.path)
    assert len(events) == 4
    assert events[0]["file_version"] == "brain.Event:2" and "scalars" not in events[0]
    assert [e["step"] for e in events[1:]] == [0, 5, 10]
    assert events[1] == {"wall_time": 1000.25, "step": 0,
                         "scalars": {"loss": f32(0.1), "reward/mean": f32(12.34567)}}
    assert events[2] == {"wall_time": 1001.5, "step": 5,
                         "scalars": {"loss": f32(0.05), "np": 2.5, "int": 7.0, "inf": math.inf}}
    assert events[3]["scalars"] == {"loss": -3.0}
    assert events[0]["wall_time"] <= events[3]["wall_time"]
    assert abs(events[3]["wall_time"] - time.time()) < 60


def test_file_name_and_modes(tmp_path):
    logdir = tmp_path / "a" / "b"
    w = EventWriter(logdir)
    w.close()
    m = re.fullmatch(r"events\.out\.tfevents\.(\d+)\.(.+)\.(\d+)\.rlinkd", w.path.name)
    assert m and m.group(2) == socket.gethostname() and int(m.group(3)) == os.getpid()
    assert stat.S_IMODE(logdir.stat().st_mode) == 0o700
    assert stat.S_IMODE(w.path.stat().st_mode) == 0o600


def test_call_with_only_skipped_values_writes_nothing(tmp_path):
    with EventWriter(tmp_path) as w:
        w.add_scalars(1, {"a": None, "b": float("nan")})
        w.add_scalars(2, {})
    assert [("scalars" in e) for e in read_events(w.path)] == [False]


def test_flush_makes_events_readable_before_close(tmp_path):
    w = EventWriter(tmp_path)
    assert len(read_events(w.path)) == 1          # the constructor flushes the header
    w.add_scalars(3, {"x": 1.0})
    w.flush()
    assert read_events(w.path)[-1]["scalars"] == {"x": 1.0}
    w.close()


def test_close_is_idempotent_and_use_after_close_fails(tmp_path):
    w = EventWriter(tmp_path)
    w.close()
    w.close()
    assert w.closed
    with pytest.raises(ValueError):
        w.add_scalars(1, {"x": 1.0})
    with pytest.raises(ValueError):
        w.flush()


def test_unusable_directory_raises_oserror(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(OSError):
        EventWriter(not_a_dir)


def test_write_error_reaches_caller_and_close_still_closes(tmp_path):
    w = EventWriter(tmp_path)
    w._file.close()
    w._file = open("/dev/full", "ab")  # noqa: SIM115 - the writer owns it; every flush fails with ENOSPC
    w.add_scalars(1, {"x": 1.0})
    with pytest.raises(OSError):
        w.flush()
    with pytest.raises(OSError):
        w.close()                                 # the buffered record is still pending
    assert w.closed
    w.close()


# --- corruption ------------------------------------------------------------------------------

def test_every_flipped_byte_is_detected(tmp_path):
    with EventWriter(tmp_path) as w:
        w.add_scalars(1, {"loss": 0.25})
        w.add_scalars(2, {"loss": 0.125, "kl": 0.01})
    good = w.path.read_bytes()
    assert len(read_events(w.path)) == 3
    for i in range(len(good)):
        bad = bytearray(good)
        bad[i] ^= 0x40
        w.path.write_bytes(bytes(bad))
        with pytest.raises(ValueError, match="CRC mismatch"):
            read_events(w.path)


def test_truncated_file_is_detected(tmp_path):
    with EventWriter(tmp_path) as w:
        w.add_scalars(1, {"loss": 0.25})
    good = w.path.read_bytes()
    for cut in (1, 4, 13, len(good) - 1):
        w.path.write_bytes(good[:len(good) - cut])
        with pytest.raises(ValueError, match="truncated"):
            read_events(w.path)


# --- cross-check with TensorBoard itself, when it happens to be installed -------------------

def test_tensorboard_event_accumulator_reads_file(tmp_path):
    """Reported as skipped (not passed) when TensorBoard is not installed."""
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    with EventWriter(tmp_path) as w:
        w.add_scalars(1, {"loss": 0.5, "reward": 3.0}, wall_time=10.0)
        w.add_scalars(2, {"loss": 0.25}, wall_time=11.0)
    assert len(read_events(w.path)) == 3
    acc = accumulator.EventAccumulator(str(tmp_path))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["loss", "reward"]
    assert [(e.wall_time, e.step, e.value) for e in acc.Scalars("loss")] == [
        (10.0, 1, 0.5), (11.0, 2, 0.25)]
    assert [(e.step, e.value) for e in acc.Scalars("reward")] == [(1, 3.0)]
