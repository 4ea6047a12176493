"""The train batch is declared once (daemon.batch_schema): the slot segment is laid out from
it, the connector writes exactly its columns and meta, the learner reads exactly them."""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile

import numpy as np
import pytest

from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import Box, Dict, Discrete, MultiDiscrete
from rlinkd.daemon import batch_schema as schema
from rlinkd.daemon.batch_schema import BatchMeta
from rlinkd.daemon.connector.pipeline import LearnerPipeline
from rlinkd.daemon.config import PPOConfig
from rlinkd.shm.slots import BatchSlots
from tests.unit.test_connector import DEFAULT_PIECES, SPEC, ctx, three_segments

BOX = PolicySpec(Box([3]), Box([2], low=-1.0, high=1.0))
COMPOSITE = PolicySpec(Dict({"camera": Box([6, 6, 3], "uint8", 0, 255), "mode": Discrete(3)}),
                       Dict({"turn": Discrete(3), "gears": MultiDiscrete([2, 2]),
                             "throttle": Box([1], low=0.0, high=1.0)}))
META = BatchMeta(ingest_cutoff=41, episodes=3, dropped_episodes=1, values_seq_no=9,
                 behaviour_min=7, behaviour_sum=3 * 7 + 4 * 10, behaviour_steps=7)


@pytest.fixture
def slots():
    directory = tempfile.mkdtemp(prefix="rlkt-schema-", dir="/dev/shm")
    slots = BatchSlots.create(os.path.join(directory, "slots"), schema.slot_columns(COMPOSITE),
                              capacity_rows=16, n_slots=2, meta_fields=schema.META_FIELDS)
    yield slots
    slots.close()
    shutil.rmtree(directory)


def test_slot_columns_follow_the_policy_spec():
    columns = schema.slot_columns(SPEC)
    assert tuple(columns) == ("obs:obs", *schema.COLUMN_NAMES[1:])  # a root leaf's field is "obs"
    assert columns["obs:obs"] == ((2,), "<f4")
    assert columns["actions"] == ((1,), "float32")  # the Discrete index
    assert schema.slot_columns(BOX)["actions"] == ((2,), "float32")
    assert {name for name, (shape, _) in schema.slot_columns(BOX).items() if shape == ()} \
        == set(schema.PER_ROW_COLUMNS)


def test_slot_columns_of_composite_spaces_keep_leaf_dtypes():
    columns = schema.slot_columns(COMPOSITE)
    assert columns["obs:camera"] == ((6, 6, 3), "|u1")   # a uint8 image stays uint8
    assert columns["obs:mode"] == ((), "<i8")
    assert columns["actions"] == ((1 + 2 + 1,), "float32")  # index vector, Box value


def composite_batch(rows: int = 6) -> dict:
    """A pipeline-shaped batch of COMPOSITE (the pipeline itself is tested in test_connector)."""
    rng = np.random.default_rng(5)
    return {"obs": {"camera": rng.integers(0, 256, (rows, 6, 6, 3)).astype(np.uint8),
                    "mode": rng.integers(0, 3, rows)},
            "actions": np.float32(np.c_[rng.integers(0, 3, rows), rng.integers(0, 2, (rows, 2)),
                                        rng.uniform(0, 1, rows)]),
            "logp": -rng.uniform(0, 2, rows).astype(np.float32),
            "advantages": rng.normal(size=rows).astype(np.float32),
            "value_targets": rng.normal(size=rows).astype(np.float32),
            "values": rng.normal(size=rows).astype(np.float32),
            "rewards": np.ones(rows, np.float32)}


def test_connector_writes_and_learner_reads_exactly_the_declared_columns(slots):
    batch = composite_batch()
    slot = slots.acquire_free()
    for view in slots.columns(slot).values():
        view[...] = 0 if view.dtype.kind in "iub" else np.nan
    rows = schema.write_columns(slots.columns(slot), batch, COMPOSITE)
    slots.mark_ready(slot, rows, META.as_slot_meta())

    taken = slots.take_ready()
    read = schema.read_columns(slots.columns(taken), slots.rows(taken), COMPOSITE)
    assert tuple(read) == schema.COLUMN_NAMES and rows == 6
    assert "rewards" not in read  # only declared columns cross the slot
    assert list(read["obs"]) == ["camera", "mode"]
    for key, column in batch["obs"].items():
        assert read["obs"][key].dtype == column.dtype
        np.testing.assert_array_equal(read["obs"][key], column)
    for name in schema.COLUMN_NAMES[1:]:
        np.testing.assert_array_equal(read[name].reshape(len(batch[name]), -1),
                                      np.asarray(batch[name], np.float32).reshape(rows, -1))
    assert BatchMeta.from_slot_meta(slots.meta(taken)) == META
    slots.release(taken)


def test_pipeline_batch_has_every_declared_column():
    batch = LearnerPipeline(DEFAULT_PIECES)(three_segments(), ctx())
    assert set(schema.COLUMN_NAMES) < set(batch)  # the pipeline also makes rewards, ...
    assert set(batch["obs"]) == {leaf.key for leaf in SPEC.obs_space.leaves()}


def test_the_learner_needs_every_declared_column():
    from rlinkd.daemon.learner.learner import Learner
    batch = LearnerPipeline(DEFAULT_PIECES)(three_segments(), ctx())
    learner = Learner(SPEC, PPOConfig(num_epochs=1, minibatch_size=4), device="cpu")
    declared = {name: batch[name] for name in schema.COLUMN_NAMES}
    learner.update(declared)
    for name in schema.COLUMN_NAMES:
        with pytest.raises(ValueError, match=name):
            learner.update({k: v for k, v in declared.items() if k != name})


def test_meta_is_exactly_the_slot_meta_fields():
    assert tuple(META.as_slot_meta()) == schema.META_FIELDS
    with pytest.raises(TypeError):
        BatchMeta.from_slot_meta({**META.as_slot_meta(), "unknown": 1})
    with pytest.raises(TypeError):
        BatchMeta.from_slot_meta({"ingest_cutoff": 1})


def test_policy_lag_is_measured_against_the_version_trained_from():
    assert META.policy_lag(12) == (5, round(12 - 61 / 7, 3))
    unknown = dataclasses.replace(META, behaviour_min=-1, behaviour_sum=0, behaviour_steps=0)
    assert unknown.policy_lag(12) == (None, None)
