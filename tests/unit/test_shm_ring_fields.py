"""StepRing with mixed-dtype obs fields: uint8 images stay bytes end to end, attach checks every field."""

import json
import os

import numpy as np
import pytest

from rlinkd.shm.errors import LayoutError, RingFull
from rlinkd.shm.records import HAS_DIST, HAS_LOGP, TERMINATED, StepLayout
from rlinkd.shm.ring import HEADER_BYTES, RING_HEADER, StepRing, layout_description, records_offset
from rlinkd.shm.segment import Segment
from tests.unit.shm_helpers import set_header_field

IMAGE = StepLayout((("camera", "|u1", (84, 84, 3)), ("vec", "<f4", (3,)), ("count", "<i8", ()),
                    ("action_mask", "|i1", (5,))), 2, 7)
LAYOUT_BYTES_FIELD = 6  # index of layout_bytes in RING_HEADER


@pytest.fixture
def ring(shm_dir):
    ring = StepRing.create(os.path.join(shm_dir, "ring"), IMAGE, 8)
    yield ring
    ring.close()


def image_records(start: int, count: int) -> np.ndarray:
    """``count`` records whose every field derives from its number (images: random bytes)."""
    rec = IMAGE.empty(count)
    numbers = np.arange(start, start + count)
    rec["obs"]["camera"] = [np.random.default_rng(n).integers(0, 256, (84, 84, 3), dtype=np.uint8) for n in numbers]
    rec["obs"]["vec"] = numbers[:, None] * np.float32([1, 0.5, 0.25])
    rec["obs"]["count"] = numbers * (1 << 40)  # needs int64
    rec["obs"]["action_mask"] = (numbers[:, None] + np.arange(5)) % 3 - 1
    rec["weights_seq_no"] = numbers
    rec["action"] = numbers[:, None] * 0.5
    rec["dist"] = numbers[:, None] + np.arange(7)
    return rec


def test_records_area_and_every_field_are_aligned(ring):
    assert ring.records_offset % 64 == 0 and ring.records_offset >= HEADER_BYTES + len(layout_description(IMAGE))
    out = np.frombuffer(ring.segment.buf, IMAGE.dtype, ring.capacity, ring.records_offset)
    for name, dtype, _ in IMAGE.obs_fields:
        assert out["obs"][name].ctypes.data % np.dtype(dtype).itemsize == 0
        assert out["obs"][name].strides[0] == IMAGE.record_bytes
    del out


def test_uint8_images_round_trip_bit_exact_across_wrap_around(ring):
    written = read = 0
    for size in [3, 5, 7, 2, 8, 6, 4, 1] * 3:
        block = image_records(written, size)
        written += ring.write_batch(block)
        out = ring.read_batch(8)
        expected = image_records(read, len(out))  # the same records, made afresh
        assert out.dtype == IMAGE.dtype and out["obs"]["camera"].dtype == np.uint8
        assert out.tobytes() == expected.tobytes()  # every byte, images and padding included
        read += len(out)
    assert written == read and written > 4 * ring.capacity


def test_generic_write_step_writes_each_field_in_its_dtype(ring):
    image = np.random.default_rng(1).integers(0, 256, (84, 84, 3), dtype=np.uint8)
    obs = {"camera": image, "vec": [1.5, 2.5, 3.5], "count": 1 << 40, "action_mask": np.int8([1, 0, 1, 1, 0])}
    ring.write_step(TERMINATED, obs, [0.25, 0.5], 2.0, logp=-0.5, dist=np.arange(7), weights_seq_no=9)
    ring.write_step(0, {**obs, "count": 3}, np.float32([1, 2]), -1.0)
    out = ring.read_batch(8)
    assert len(out) == 2
    assert out["obs"]["camera"][0].tobytes() == image.tobytes()
    np.testing.assert_array_equal(out["obs"]["vec"][0], [1.5, 2.5, 3.5])
    assert out["obs"]["count"].tolist() == [1 << 40, 3]
    np.testing.assert_array_equal(out["obs"]["action_mask"][1], [1, 0, 1, 1, 0])
    assert out["flags"].tolist() == [TERMINATED | HAS_LOGP | HAS_DIST, 0]
    assert out["weights_seq_no"].tolist() == [9, -1] and out["logp"].tolist() == [-0.5, 0.0]
    assert out["reward"].tolist() == [2.0, -1.0] and out["stream_id"].tolist() == [0, 0]
    np.testing.assert_array_equal(out["action"], [[0.25, 0.5], [1, 2]])
    np.testing.assert_array_equal(out["dist"], [np.arange(7), np.zeros(7)])


def test_generic_write_step_single_non_float_field_takes_the_bare_value(shm_dir):
    layout = StepLayout((("obs", "<i8", ()),), 1, 3)  # a Discrete observation
    ring = StepRing.create(os.path.join(shm_dir, "d"), layout, 4)
    ring.write_step(0, 2, 1, 0.0)
    ring.write_step(0, np.int64(5), np.float32([0]), 0.0)
    assert ring.read_batch(4)["obs"]["obs"].tolist() == [2, 5]
    ring.close()


@pytest.mark.parametrize("obs, action, dist, message", [
    ({"camera": np.zeros((84, 84, 3), np.float32)}, [0, 0], None, "float32 values do not fit a uint8 field"),
    ({"camera": np.zeros((84, 3, 84), np.uint8)}, [0, 0], None, r"obs\['camera'\] has shape"),
    ({"count": 1.5}, [0, 0], None, "float64 values do not fit a int64 field"),
    ({"extra": 1}, [0, 0], None, "do not match the step layout"),
    ({}, [0], None, "action has 1 values"),
    ({}, [0, 0], [1.0], "dist has 1 values"),
])
def test_generic_write_step_rejects_bad_values_without_publishing(ring, obs, action, dist, message):
    good = {"camera": np.zeros((84, 84, 3), np.uint8), "vec": [0, 0, 0], "count": 0, "action_mask": [0] * 5}
    with pytest.raises(ValueError, match=message):
        ring.write_step(0, {**good, **obs}, action, 0.0, dist=dist)
    assert ring.readable_records() == 0
    ring.write_step(0, good, [0, 0], 0.0)
    assert ring.readable_records() == 1


def test_generic_write_step_raises_ring_full(ring):
    good = {"camera": np.zeros((84, 84, 3), np.uint8), "vec": [0, 0, 0], "count": 0, "action_mask": [0] * 5}
    for _ in range(8):
        ring.write_step(0, good, [0, 0], 0.0)
    with pytest.raises(RingFull, match="is full"):
        ring.write_step(0, good, [0, 0], 0.0)
    assert len(ring.read_batch(9)) == 8


def test_attach_without_expectation_reads_back_the_full_layout(ring):
    observer = StepRing.attach(ring.path, role="observer")
    assert observer.layout == IMAGE and observer.capacity == 8
    ring.write_batch(image_records(0, 2))
    assert observer.readable_records() == 2
    observer.close()


@pytest.mark.parametrize("expected, message", [
    (StepLayout((("camera", "|u1", (84, 84, 3)), ("vec", "<f4", (3,)), ("count", "<i4", ()),
                 ("action_mask", "|i1", (5,))), 2, 7),
     r"obs field 2: header has \('count', '<i8', \(\)\), expected \('count', '<i4', \(\)\)"),
    (StepLayout((("camera", "|u1", (84, 3, 84)), ("vec", "<f4", (3,)), ("count", "<i8", ()),
                 ("action_mask", "|i1", (5,))), 2, 7),
     r"obs field 0: header has \('camera', '\|u1', \(84, 84, 3\)\), expected \('camera', '\|u1', \(84, 3, 84\)\)"),
    (StepLayout((("camera", "|u1", (84, 84, 3)), ("vec", "<f4", (3,)), ("count", "<i8", ()),
                 ("action_mask", "|b1", (5,))), 2, 7), r"obs field 3: header has"),
    (StepLayout((("camera", "|u1", (84, 84, 3)), ("vec", "<f4", (3,)), ("count", "<i8", ())), 2, 7),
     r"header has 4 obs fields, expected 3"),
    (StepLayout(IMAGE.obs_fields, 2, 8), r"header has action/dist sizes \(2, 7\), expected \(2, 8\)"),
])
def test_attach_refuses_a_layout_differing_in_one_field(ring, expected, message):
    with pytest.raises(LayoutError, match="step layout mismatch in .*/ring: " + message):
        StepRing.attach(ring.path, expected_layout=expected)


def _forge_description(path: str, description: bytes) -> None:
    segment = Segment.attach(path)
    segment.buf[HEADER_BYTES:HEADER_BYTES + len(description)] = description
    set_header_field(segment, RING_HEADER, LAYOUT_BYTES_FIELD, len(description))
    segment.close()


def _same_length(text: str, like: bytes) -> bytes:
    return text.encode().ljust(len(like))


@pytest.mark.parametrize("forge, message", [
    (lambda d: d[:-1], "bad step layout description"),                                  # truncated JSON
    (lambda d: b"\xff" + d[1:], "bad step layout description"),                          # not ASCII
    (lambda d: d.replace(b'"|u1"', b'"<f4"'), "bad step layout description.*record_bytes 21272 does not match"),
    (lambda d: d.replace(b'"<i8"', b'"<f8"'), "bad step layout description"),             # dtype not allowed
    (lambda d: json.dumps(json.loads(d), sort_keys=True).encode(), "not in canonical form"),
    (lambda d: d.replace(b'"action_size":2', b'"action_size":3'), "step layout mismatch"),  # same size, other layout
])
def test_attach_refuses_a_forged_layout_description(ring, forge, message):
    _forge_description(ring.path, forge(layout_description(IMAGE)))
    with pytest.raises(LayoutError, match=message):
        StepRing.attach(ring.path, expected_layout=IMAGE)


@pytest.mark.parametrize("length", [0, 1 << 17, 10 ** 9])
def test_attach_refuses_an_out_of_range_description_length(ring, length):
    segment = Segment.attach(ring.path)
    set_header_field(segment, RING_HEADER, LAYOUT_BYTES_FIELD, length)
    segment.close()
    with pytest.raises(LayoutError, match=f"layout_bytes {length} .* out of range"):
        StepRing.attach(ring.path)


def test_records_offset_follows_the_description_length():
    flat = StepLayout.flat(4, 1, 2)
    assert records_offset(flat) == (HEADER_BYTES + len(layout_description(flat)) + 63) // 64 * 64
    assert records_offset(IMAGE) > records_offset(flat)
