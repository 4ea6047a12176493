"""StepLayout: the numpy dtype and the struct describe the same bytes."""

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlinkd.shm.records import FINAL_OBS, FLUSH, HAS_DIST, HAS_LOGP, STREAM_END, TERMINATED, TRUNCATED, StepLayout

sizes = st.tuples(st.integers(1, 40), st.integers(1, 6), st.integers(0, 12))


def test_cartpole_layout_matches_the_documented_diagram():
    layout = StepLayout(4, 1, 2)
    assert layout.record_bytes == 64  # 32 + 4*(4+1+2) = 60, padded to 64
    offsets = {name: layout.dtype.fields[name][1] for name in layout.dtype.names}
    assert offsets == {"flags": 0, "stream_id": 4, "weights_seq_no": 8, "ingest_id": 16, "reward": 24,
                       "logp": 28, "obs": 32, "action": 48, "dist": 52}
    assert layout.dtype["obs"].shape == (4,) and layout.dtype["action"].shape == (1,)
    assert [TERMINATED, TRUNCATED, FINAL_OBS, FLUSH, HAS_LOGP, HAS_DIST, STREAM_END] == [1, 2, 4, 8, 16, 32, 64]


@settings(max_examples=60, deadline=None)
@given(sizes=sizes, seed=st.integers(0, 2**32 - 1))
def test_struct_packed_record_reads_back_through_the_dtype(sizes, seed):
    layout = StepLayout(*sizes)
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal(layout.obs_size).astype(np.float32)
    action = rng.standard_normal(layout.action_size).astype(np.float32)
    dist = rng.standard_normal(layout.dist_size).astype(np.float32)
    scalars = (int(rng.integers(0, 64)), int(rng.integers(0, 2**32)), int(rng.integers(-1, 2**62)),
               int(rng.integers(0, 2**63)), float(np.float32(rng.standard_normal())),
               float(np.float32(rng.standard_normal())))
    buffer = bytearray(layout.record_bytes)
    layout.struct.pack_into(buffer, 0, *scalars, *obs.tolist(), *action.tolist(), *dist.tolist())
    record = np.frombuffer(buffer, layout.dtype)[0]
    assert tuple(record[name].item() for name in
                 ("flags", "stream_id", "weights_seq_no", "ingest_id", "reward", "logp")) == scalars
    np.testing.assert_array_equal(record["obs"], obs)
    np.testing.assert_array_equal(record["action"], action)
    np.testing.assert_array_equal(record["dist"], dist)


@settings(max_examples=60, deadline=None)
@given(sizes=sizes)
def test_sizes_agree_and_records_are_8_byte_multiples(sizes):
    layout = StepLayout(*sizes)
    assert layout.dtype.itemsize == layout.struct.size == layout.record_bytes
    assert layout.record_bytes % 8 == 0
    assert layout.record_bytes - (32 + 4 * sum(sizes)) in range(8)


def test_json_round_trip_and_mismatch():
    layout = StepLayout(17, 2, 5)
    spec = layout.to_json()
    assert spec == {"obs_size": 17, "action_size": 2, "dist_size": 5, "record_bytes": 128}
    assert StepLayout.from_json(spec) == layout
    with pytest.raises(ValueError, match="record_bytes 120 does not match"):
        StepLayout.from_json({**spec, "record_bytes": 120})


@pytest.mark.parametrize("bad", [(0, 1, 0), (4, 0, 0), (4, 1, -1)])
def test_degenerate_sizes_are_refused(bad):
    with pytest.raises(ValueError, match="bad step layout sizes"):
        StepLayout(*bad)


def test_struct_format_is_little_endian_without_native_alignment():
    layout = StepLayout(3, 1, 0)  # 32 + 16 = 48, no padding needed
    assert layout.struct.format.startswith("<")
    assert struct.calcsize(layout.struct.format) == 48 == layout.record_bytes
