"""StepLayout: the numpy dtype and the struct describe the same bytes, for any mix of obs dtypes."""

import math
import pickle
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlinkd.shm.records import (FIELD_DTYPES, FINAL_OBS, FLUSH, HAS_DIST, HAS_LOGP, STREAM_END, TERMINATED,
                                TRUNCATED, StepLayout)

sizes = st.tuples(st.integers(1, 40), st.integers(1, 6), st.integers(0, 12))
field_lists = st.lists(
    st.tuples(st.sampled_from(sorted(FIELD_DTYPES)), st.lists(st.integers(1, 4), max_size=3).map(tuple)),
    min_size=1, max_size=6)
mixed_layouts = st.builds(
    lambda fields, a, d, s: StepLayout(tuple((f"f{i}.x", dt, shape) for i, (dt, shape) in enumerate(fields)),
                                       a, d, s),
    field_lists, st.integers(1, 6), st.integers(0, 12), st.sampled_from([0, 0, 1, 5, 16]))

IMAGE = StepLayout((("camera", "|u1", (84, 84, 3)), ("vec", "<f4", (3,)), ("count", "<i8", ()),
                    ("action_mask", "|i1", (5,))), 2, 7)


def random_values(dtype: str, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    if dt.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)


def test_cartpole_layout_matches_the_documented_diagram():
    layout = StepLayout.flat(4, 1, 2)
    assert layout.record_bytes == 64  # 32 + 4*(4+1+2) = 60, padded to 64
    offsets = {name: layout.dtype.fields[name][1] for name in layout.dtype.names}
    assert offsets == {"flags": 0, "stream_id": 4, "weights_seq_no": 8, "ingest_id": 16, "reward": 24,
                       "logp": 28, "obs": 32, "action": 48, "dist": 52}
    assert layout.dtype["obs"]["obs"].shape == (4,) and layout.dtype["action"].shape == (1,)
    assert layout.is_flat and layout.obs_fields == (("obs", "<f4", (4,)),)
    assert [TERMINATED, TRUNCATED, FINAL_OBS, FLUSH, HAS_LOGP, HAS_DIST, STREAM_END] == [1, 2, 4, 8, 16, 32, 64]


@settings(max_examples=60, deadline=None)
@given(sizes=sizes)
def test_flat_layouts_are_the_original_float_only_record(sizes):
    """Same struct format string (hence bytes) as the record before per-field dtypes existed."""
    o, a, d = sizes
    layout = StepLayout.flat(o, a, d)
    floats = "".join(f"{n}f" for n in (o, a, d) if n)
    padding = (-(32 + 4 * (o + a + d))) % 8
    assert layout.struct.format == "<B3xIqQff" + floats + (f"{padding}x" if padding else "")
    assert (layout.action_offset, layout.dist_offset) == (32 + 4 * o, 32 + 4 * (o + a))
    assert layout.is_flat


@settings(max_examples=80, deadline=None)
@given(layout=mixed_layouts, seed=st.integers(0, 2**32 - 1))
def test_struct_packed_record_reads_back_through_the_dtype(layout, seed):
    rng = np.random.default_rng(seed)
    obs = {name: random_values(dtype, shape, rng) for name, dtype, shape in layout.obs_fields}
    action = rng.standard_normal(layout.action_size).astype(np.float32)
    dist = rng.standard_normal(layout.dist_size).astype(np.float32)
    state = rng.standard_normal(layout.state_size).astype(np.float32)
    scalars = (int(rng.integers(0, 64)), int(rng.integers(0, 2**32)), int(rng.integers(-1, 2**62)),
               int(rng.integers(0, 2**63)), float(np.float32(rng.standard_normal())),
               float(np.float32(rng.standard_normal())))
    flat_obs = [v for name, _, _ in layout.obs_fields for v in obs[name].reshape(-1).tolist()]
    buffer = bytearray(layout.record_bytes)
    layout.struct.pack_into(buffer, 0, *scalars, *flat_obs, *action.tolist(), *dist.tolist(),
                            *state.tolist())
    record = np.frombuffer(buffer, layout.dtype)[0]
    assert tuple(record[name].item() for name in
                 ("flags", "stream_id", "weights_seq_no", "ingest_id", "reward", "logp")) == scalars
    for name, dtype, shape in layout.obs_fields:
        got = np.asarray(record["obs"][name])
        assert got.dtype == np.dtype(dtype) and got.shape == shape
        np.testing.assert_array_equal(got, obs[name])
    np.testing.assert_array_equal(record["action"], action)
    np.testing.assert_array_equal(record["dist"], dist)
    if layout.state_size:
        np.testing.assert_array_equal(record["state"], state)
    else:
        assert "state" not in layout.dtype.names


@settings(max_examples=100, deadline=None)
@given(layout=mixed_layouts)
def test_sizes_agree_and_every_field_is_aligned(layout):
    assert layout.dtype.itemsize == layout.struct.size == layout.record_bytes
    assert layout.record_bytes % 8 == 0
    pos = 32
    for (name, dtype, shape), offset in zip(layout.obs_fields, layout.field_offsets):
        itemsize = np.dtype(dtype).itemsize
        assert offset % itemsize == 0 and 0 <= offset - pos < itemsize  # aligned, no needless gap
        assert layout.dtype.fields["obs"][1] + layout.dtype["obs"].fields[name][1] == offset
        pos = offset + itemsize * math.prod(shape)
    assert layout.action_offset % 4 == 0 and 0 <= layout.action_offset - pos < 4
    assert layout.dtype.fields["action"][1] == layout.action_offset
    assert layout.dtype.fields["dist"][1] == layout.dist_offset == layout.action_offset + 4 * layout.action_size
    assert layout.state_offset == layout.dist_offset + 4 * layout.dist_size
    if layout.state_size:
        assert layout.dtype.fields["state"][1] == layout.state_offset
    assert 0 <= layout.record_bytes - (layout.state_offset + 4 * layout.state_size) < 8
    assert StepLayout.from_json(layout.to_json()) == layout
    assert pickle.loads(pickle.dumps(layout)) == layout


def test_image_layout_offsets_and_views():
    assert IMAGE.field_offsets == (32, 21200, 21216, 21224)  # vec 4-aligned, count 8-aligned
    assert (IMAGE.action_offset, IMAGE.dist_offset, IMAGE.record_bytes) == (21232, 21240, 21272)
    assert not IMAGE.is_flat
    rec = IMAGE.empty(3)
    assert rec["obs"]["camera"].shape == (3, 84, 84, 3) and rec["obs"]["camera"].dtype == np.uint8
    assert rec["obs"]["count"].shape == (3,) and rec["obs"]["count"].dtype == np.int64
    assert rec["obs"]["action_mask"].dtype == np.int8


def test_json_round_trip_and_mismatch():
    layout = StepLayout.flat(17, 2, 5)
    spec = layout.to_json()
    assert spec == {"obs_fields": [["obs", "<f4", [17]]], "action_size": 2, "dist_size": 5, "record_bytes": 128}
    assert StepLayout.from_json(spec) == layout
    with pytest.raises(ValueError, match="record_bytes 120 does not match"):
        StepLayout.from_json({**spec, "record_bytes": 120})
    assert IMAGE.to_json()["obs_fields"] == [["camera", "|u1", [84, 84, 3]], ["vec", "<f4", [3]],
                                             ["count", "<i8", []], ["action_mask", "|i1", [5]]]
    assert StepLayout.from_json(IMAGE.to_json()) == IMAGE


GOOD = {"obs_fields": [["camera", "|u1", [84, 84, 3]], ["vec", "<f4", [3]]], "action_size": 2, "dist_size": 4}


@pytest.mark.parametrize("bad", [
    [], "x", None,
    {**GOOD, "obs_size": 4},                                        # unknown key
    {k: v for k, v in GOOD.items() if k != "dist_size"},            # missing key
    {**GOOD, "obs_fields": []},
    {**GOOD, "obs_fields": {"camera": 1}},
    {**GOOD, "obs_fields": [["camera", "|u1"]]},
    {**GOOD, "obs_fields": [["camera", "uint8", [84, 84, 3]]]},     # dtype not canonical
    {**GOOD, "obs_fields": [["camera", "<f8", [3]]]},
    {**GOOD, "obs_fields": [["camera", ">f4", [3]]]},
    {**GOOD, "obs_fields": [["camera", "|u1", 84]]},
    {**GOOD, "obs_fields": [["camera", "|u1", [0]]]},
    {**GOOD, "obs_fields": [["camera", "|u1", [2.0]]]},
    {**GOOD, "obs_fields": [["camera", "|u1", [True]]]},
    {**GOOD, "obs_fields": [[3, "|u1", [2]]]},
    {**GOOD, "obs_fields": [["", "|u1", [2]]]},
    {**GOOD, "obs_fields": [["a b", "|u1", [2]]]},
    {**GOOD, "obs_fields": [["x", "|u1", [2]], ["x", "<f4", [1]]]},
    {**GOOD, "obs_fields": [["x", "|u1", [1 << 20, 1 << 20]]]},     # absurd record size
    {**GOOD, "action_size": 0}, {**GOOD, "action_size": True}, {**GOOD, "action_size": 2.0},
    {**GOOD, "dist_size": -1}, {**GOOD, "dist_size": "4"},
    {**GOOD, "record_bytes": 1},
])
def test_malformed_json_is_refused(bad):
    StepLayout.from_json(GOOD)  # the base case is fine
    with pytest.raises(ValueError):
        StepLayout.from_json(bad)


@pytest.mark.parametrize("fields", [
    (), ((),), (("obs", "<f8", (4,)),), (("obs", "complex64", (4,)),), (("obs", "no-such-dtype", (4,)),),
    (("obs", ">i4", (4,)),), (("obs", "<f4", (0,)),), (("obs", "<f4", 4),), (("obs", "<f4", (-1,)),),
    (("", "<f4", (4,)),), (("a b", "<f4", (4,)),), (("x" * 65, "<f4", (4,)),), (("é", "<f4", (4,)),),
    (("obs", "<f4", (1,) * 17),), (("a", "<f4", (1,)), ("a", "|u1", (1,))),
])
def test_bad_fields_are_refused(fields):
    with pytest.raises(ValueError):
        StepLayout(fields, 1, 0)


@pytest.mark.parametrize("bad", [(0, 1, 0), (4, 0, 0), (4, 1, -1)])
def test_degenerate_sizes_are_refused(bad):
    with pytest.raises(ValueError, match="bad step layout sizes"):
        StepLayout.flat(*bad)


def test_names_may_hold_dots_and_dtypes_are_normalised():
    layout = StepLayout((("arm.joints", "float32", (2,)), ("0.x", np.uint8, ()), ("flag", bool, (3,))), 1, 0)
    assert layout.obs_fields == (("arm.joints", "<f4", (2,)), ("0.x", "|u1", ()), ("flag", "|b1", (3,)))
    assert layout == StepLayout.from_json(layout.to_json()) and hash(layout) == hash(StepLayout(*layout.sizes()))
    assert eval(repr(layout), {"StepLayout": StepLayout}) == layout


def test_layouts_differing_in_one_dtype_or_shape_differ():
    fields = list(IMAGE.obs_fields)
    other_dtype = StepLayout((*fields[:2], ("count", "<i4", ()), fields[3]), 2, 7)
    other_shape = StepLayout((("camera", "|u1", (84, 3, 84)), *fields[1:]), 2, 7)
    assert IMAGE != other_dtype and IMAGE != other_shape and other_shape.record_bytes == IMAGE.record_bytes


def test_write_obs_copies_each_field_in_its_own_dtype():
    rec = IMAGE.empty(2)
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (2, 84, 84, 3), dtype=np.uint8)
    IMAGE.write_obs(rec["obs"], {"camera": image, "vec": [[1, 2, 3], [4, 5, 6]], "count": [7, 8],
                                 "action_mask": np.int8([[1, 0, 1, 0, 1]] * 2)})
    assert rec["obs"]["camera"].tobytes() == image.tobytes()
    np.testing.assert_array_equal(rec["obs"]["vec"], np.float32([[1, 2, 3], [4, 5, 6]]))
    assert rec["obs"]["count"].tolist() == [7, 8]
    one = StepLayout((("obs", "<i8", ()),), 1, 0)
    rec = one.empty(3)
    one.write_obs(rec["obs"], np.array([1, 2, 3]))  # a single field takes the bare array
    assert rec["obs"]["obs"].tolist() == [1, 2, 3]


@pytest.mark.parametrize("change, message", [
    ({"camera": np.zeros((2, 84, 84, 3), np.float32)}, "float32 values do not fit a uint8 field"),
    ({"camera": np.full((2, 84, 84, 3), 256)}, r"values outside \[0, 255\]"),
    ({"action_mask": np.full((2, 5), -129)}, r"values outside \[-128, 127\]"),
    ({"camera": np.zeros((2, 84, 3, 84), np.uint8)}, "has shape .* expects"),
    ({"vec": np.zeros((2,), np.float32)}, "has shape .* expects"),
    ({"vec": np.array([["a"] * 3] * 2)}, "do not fit a float32 field"),
    ({"extra": np.zeros(2)}, "do not match the step layout"),
])
def test_write_obs_refuses_values_that_do_not_fit(change, message):
    obs = {"camera": np.zeros((2, 84, 84, 3), np.uint8), "vec": np.zeros((2, 3)), "count": np.zeros(2, np.int64),
           "action_mask": np.zeros((2, 5), np.int8), **change}
    with pytest.raises(ValueError, match=message):
        IMAGE.write_obs(IMAGE.empty(2)["obs"], obs)
    with pytest.raises(ValueError, match="must be a mapping"):
        IMAGE.write_obs(IMAGE.empty(2)["obs"], obs["camera"])


def test_struct_format_is_little_endian_without_native_alignment():
    layout = StepLayout.flat(3, 1, 0)  # 32 + 16 = 48, no padding needed
    assert layout.struct.format.startswith("<")
    assert struct.calcsize(layout.struct.format) == 48 == layout.record_bytes
    assert IMAGE.struct.format == "<B3xIqQff21168B3f4x1q5b3x2f7f4x"
