"""BlobArea: round trip, generations, capacity limit, sha256 mismatch, header checks."""

import os
import threading

import pytest

from rlinkd.shm.blob import BLOB_HEADER, PAYLOAD_OFFSET, BlobArea
from rlinkd.shm.errors import ChecksumError, LayoutError, PayloadTooLarge, ShmError
from tests.unit.shm_helpers import set_header_field


@pytest.fixture
def blob(shm_dir):
    blob = BlobArea.create(os.path.join(shm_dir, "blob"), 1 << 16)
    yield blob
    blob.close()


def test_round_trip_through_another_mapping(blob):
    reader = BlobArea.attach(blob.path)
    assert reader.read() == (0, b"")
    assert blob.write(b"checkpoint-1" * 100) == 1
    assert blob.write(bytearray(b"short")) == 2
    assert reader.read() == (2, b"short")
    assert blob.write(os.urandom(1 << 16)) == 3 and reader.generation() == 3
    reader.close()


def test_oversized_payload_is_refused_and_nothing_changes(blob):
    blob.write(b"keep me")
    with pytest.raises(PayloadTooLarge, match=r"payload of 65537 bytes exceeds the 65536-byte blob area"):
        blob.write(b"x" * 65537)
    assert blob.read() == (1, b"keep me")


def test_corrupted_payload_fails_its_checksum(blob):
    blob.write(b"precious bytes")
    other = BlobArea.attach(blob.path)
    other.segment.buf[PAYLOAD_OFFSET + 3] ^= 0xFF
    with pytest.raises(ChecksumError, match="does not match its sha256"):
        blob.read()
    other.close()


def test_read_waits_out_an_unfinished_write(blob):
    blob.write(b"v1")
    blob._seqlock[0] += 1  # as if a writer were mid-write
    with pytest.raises(ShmError, match=r"write in progress for over 0.05s \(writer pid"):
        blob.read(timeout_s=0.05)
    finisher = threading.Timer(0.05, blob.write, args=(b"v2",))
    finisher.start()
    assert blob.read(timeout_s=10.0) == (3, b"v2")  # the interrupted write used up generation 2
    finisher.join()


@pytest.mark.parametrize("index, value, message", [
    (0, b"RLKBOARD", r"bad magic b'RLKBOARD' in .*/blob: not an rlinkd blob area"),
    (1, 7, r"layout_version mismatch in .*/blob: header has 7, expected 1"),
    (2, 1 << 20, r"file size .* mismatch in .*/blob: header has 65664"),
    (3, 0, r"writer_pid 0 in .*/blob: header was never completed"),
])
def test_attach_refuses_bad_headers(blob, index, value, message):
    set_header_field(blob.segment, BLOB_HEADER, index, value)
    with pytest.raises(LayoutError, match=message):
        BlobArea.attach(blob.path)
