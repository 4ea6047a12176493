"""validate_records on per-leaf records: image bounds, actions and masks of step records only
(a FINAL_OBS record's action and mask are not checked)."""
from __future__ import annotations

import numpy as np
import pytest

from rlinkd.client_lib.protocol.masking import mask_spec
from rlinkd.client_lib.protocol.spaces import Box, Dict, Discrete, MultiBinary, record_fields
from rlinkd.daemon.collector.ingest import InvalidEpisode, Spaces
from rlinkd.daemon.collector.shm_clients import validate_records
from rlinkd.shm.records import FINAL_OBS, TERMINATED, StepLayout

OBS = Dict({"camera": Box((4, 4, 3), "uint8", 0, 200), "mask": MultiBinary(3)})
ACT = Discrete(3)
SPACES = Spaces(OBS, ACT, ACT.dist_size, mask_spec(OBS, ACT, "mask"))
LAYOUT = StepLayout(record_fields(OBS), ACT.action_size, ACT.dist_size)


def records() -> np.ndarray:
    """Two steps (actions 0 and 2, legal) and a FINAL_OBS record whose mask allows nothing."""
    rec = LAYOUT.empty(3)
    rec["obs"]["camera"] = 100
    rec["obs"]["mask"] = [[1, 0, 1], [0, 0, 1], [0, 0, 0]]
    rec["action"][:, 0] = [0, 2, 1]
    rec["flags"][2] = FINAL_OBS | TERMINATED
    return rec


def test_legal_steps_pass_and_the_final_records_action_and_mask_are_not_checked():
    validate_records(records(), SPACES)


@pytest.mark.parametrize("change, message", [
    (lambda r: r["action"].__setitem__((1, 0), 1), "not allowed|illegal|mask"),
    (lambda r: r["obs"]["mask"].__setitem__(0, [0, 0, 0]), "mask"),
    (lambda r: r["obs"]["camera"].__setitem__((2, 3, 3, 2), 201), "Box bounds"),
])
def test_an_illegal_step_action_an_empty_step_mask_or_an_image_value_out_of_bounds_is_refused(change, message):
    rec = records()
    change(rec)
    with pytest.raises(InvalidEpisode, match=message):
        validate_records(rec, SPACES)
