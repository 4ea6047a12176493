"""The train batch, declared once: the columns of a batch slot and the slot's meta fields.

The connector writes a slot (``write_columns`` + ``BatchMeta.as_slot_meta``), the learner
reads it (``read_columns`` + ``BatchMeta.from_slot_meta``), ``wiring`` lays the slot
segment out from ``slot_columns`` and ``META_FIELDS``, and the learner core validates a
batch against ``COLUMN_NAMES`` / ``PER_ROW_COLUMNS``. Nothing else names a column or a meta
field. Pure: numpy and the policy spec only.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import field_name

DTYPE = "float32"  # every column but the observations; discrete actions travel as indices
OBS = "obs"        # the batch key holding the observation Columns (leaf key -> [N, ...])
OBS_PREFIX = "obs:"  # slot column of one observation leaf: "obs:" + its record field name


@dataclass(frozen=True)
class Column:
    """One train-batch column besides the observations: ``width(spec)`` numbers per row,
    or one (``width`` None)."""

    name: str
    width: Callable[[PolicySpec], int] | None
    doc: str


COLUMNS = (
    Column("actions", lambda spec: spec.act_space.action_size,
           "a_t: the float32 action vector (0-based indices for discrete leaves)"),
    Column("logp", None, "log pi(a_t | s_t) under the behaviour (or batch-build) weights"),
    Column("advantages", None, "GAE advantages, normalised per batch when configured"),
    Column("value_targets", None, "advantages + values: the critic's regression targets"),
    Column("values", None, "V(s_t) under the weights the batch was built with"),
)
COLUMN_NAMES = (OBS, *(c.name for c in COLUMNS))
"""Every key a train batch holds (``OBS`` maps to a dict of leaf columns)."""
PER_ROW_COLUMNS = tuple(c.name for c in COLUMNS if c.width is None)

SEQUENCE_COLUMNS = (
    Column("seq_start", None, "1.0 on the first row of a training sequence (chunk), else 0.0"),
    Column("seq_state", lambda spec: spec.state_size,
           "the actor's state before the step on a chunk's first row (zeros elsewhere)"),
    Column("episode_start", None, "1.0 where an episode begins (the state is zeroed before it)"),
)
"""A recurrent policy's batch also holds these (``connector.sequences``); a feed-forward
policy's slot has none of them."""
SEQUENCE_COLUMN_NAMES = tuple(c.name for c in SEQUENCE_COLUMNS)


def columns_for(spec: PolicySpec) -> tuple[Column, ...]:
    """The declared columns of ``spec``'s batches: COLUMNS, then SEQUENCE_COLUMNS when the
    policy is recurrent."""
    return COLUMNS + SEQUENCE_COLUMNS if spec.state_size else COLUMNS


def slot_columns(spec: PolicySpec) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{name: (per-row shape, dtype)}`` in slot layout order, for ``BatchSlots.create``:
    one column per observation leaf in the leaf's record dtype (a uint8 image stays uint8),
    then the declared columns (``columns_for``)."""
    obs = {OBS_PREFIX + field_name(leaf.key): (leaf.space.record_shape, leaf.space.record_dtype.str)
           for leaf in spec.obs_space.leaves()}
    return {**obs, **{c.name: (() if c.width is None else (c.width(spec),), DTYPE)
                      for c in columns_for(spec)}}


def write_columns(views: dict[str, np.ndarray], batch: dict[str, Any], spec: PolicySpec) -> int:
    """Connector: copy the declared columns of a pipeline ``batch`` into a slot's column
    views (other pipeline columns stay behind); return the row count. KeyError on a missing
    column, ValueError when the batch does not fit the slot."""
    rows = len(batch["actions"])
    for leaf in spec.obs_space.leaves():
        views[OBS_PREFIX + field_name(leaf.key)][:rows] = batch[OBS][leaf.key]
    for c in columns_for(spec):
        target = views[c.name][:rows]
        target[...] = np.asarray(batch[c.name]).reshape(target.shape)
    return rows


def read_columns(views: dict[str, np.ndarray], rows: int, spec: PolicySpec) -> dict[str, Any]:
    """Learner: copies of the first ``rows`` rows of every declared column (the slot is
    released, and may be refilled, while the copies are still in use)."""
    obs = {leaf.key: np.array(views[OBS_PREFIX + field_name(leaf.key)][:rows])
           for leaf in spec.obs_space.leaves()}
    return {OBS: obs, **{c.name: np.array(views[c.name][:rows]) for c in columns_for(spec)}}


@dataclass(frozen=True)
class BatchMeta:
    """The integers a batch slot carries besides its columns (slot header meta fields)."""

    ingest_cutoff: int     # every complete segment with ingest ids <= this is trained or dropped
    episodes: int          # segments in the batch
    dropped_episodes: int  # segments dropped for policy lag while building it (off-policy)
    values_seq_no: int     # weights version the values (and recomputed logp) came from
    behaviour_min: int     # oldest behaviour version among segments that declared one, else -1
    behaviour_sum: int     # step-weighted sum of those versions
    behaviour_steps: int   # steps that declared a version (0: none did)

    def as_slot_meta(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_slot_meta(cls, meta: dict[str, int]) -> BatchMeta:
        """TypeError when the slot's fields are not exactly ours."""
        return cls(**meta)

    def policy_lag(self, trained_from: int) -> tuple[int | None, float | None]:
        """How many versions older than ``trained_from`` (the weights the learner trains
        from) the batch's data was: (max, step-weighted mean); Nones when no version was known."""
        if self.behaviour_steps <= 0:
            return None, None
        mean = trained_from - self.behaviour_sum / self.behaviour_steps
        return int(trained_from - self.behaviour_min), round(mean, 3)


META_FIELDS = tuple(f.name for f in dataclasses.fields(BatchMeta))
