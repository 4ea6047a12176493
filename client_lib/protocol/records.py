"""RLlink episode fragments ↔ shared-memory step records (``shm.records`` layout).

Used by the daemon's collector (TCP episodes into the episode ring) and by the
shared-memory client (fragments into its own ring): one conversion, both sides.
"""
from __future__ import annotations

import numpy as np

from rlinkd.client_lib.protocol.columns import Columns
from rlinkd.client_lib.protocol.fragments import Fragment
from rlinkd.client_lib.protocol.spaces import Space, field_name
from rlinkd.shm.records import (FINAL_OBS, HAS_DIST, HAS_LOGP, HAS_STATE, TERMINATED, TRUNCATED,
                                StepLayout)


def fragment_records(frag: Fragment, layout: StepLayout, stream_id: int = 0,
                     weights_seq_no: int = -1, max_seq_len: int = 0) -> np.ndarray:
    """T step records + 1 FINAL_OBS record for a validated fragment (ingest ids unset).

    A recurrent policy's layout (``state_size`` S) with ``max_seq_len`` L: ``frag.state_in``
    [ceil(T/L), S] goes into the "state" field of rows 0, L, 2L, ..., flagged HAS_STATE
    (the fragment state grid, ``protocol.recurrent``); ValueError when it is missing.

    ``frag.obs``: an array [T+1, ...] of the single obs field's values (any shape with that
    many values per step), or a mapping {field name: array [T+1, *field shape]}.

    The FINAL_OBS record holds the fragment's last observation and says how it ended
    (TERMINATED, TRUNCATED, or neither: cut, continued by the next fragment).
    """
    t = frag.num_steps
    rec = np.zeros(t + 1, dtype=layout.dtype)
    write_obs(rec, frag.obs)
    rec["stream_id"] = stream_id
    rec["weights_seq_no"] = weights_seq_no
    rec["reward"][:t] = frag.rewards
    rec["action"][:t] = frag.actions
    step_flags = 0
    if frag.action_logp is not None:
        rec["logp"][:t] = frag.action_logp
        step_flags |= HAS_LOGP
    if frag.action_dist_inputs is not None:
        rec["dist"][:t] = frag.action_dist_inputs
        step_flags |= HAS_DIST
    rec["flags"][:t] = step_flags
    if layout.state_size:
        write_state(rec[:t], frag.state_in, max_seq_len)
    end_flags = (TERMINATED if frag.is_terminated else 0) | (TRUNCATED if frag.is_truncated else 0)
    rec["flags"][t] = FINAL_OBS | end_flags
    return rec


def write_state(steps: np.ndarray, state_in: np.ndarray | None, max_seq_len: int) -> None:
    """Write a fragment's state rows into its step records' grid rows (0, L, 2L, ...) and
    flag them HAS_STATE; the other rows keep a zero state and no flag."""
    grid = grid_rows(len(steps), max_seq_len)
    if state_in is None or len(state_in) != len(grid):
        raise ValueError(f"a recurrent fragment of {len(steps)} steps needs {len(grid)} "
                         f"state_in rows (max_seq_len={max_seq_len})")
    steps["state"][grid] = state_in
    steps["flags"][grid] |= HAS_STATE


def read_state(steps: np.ndarray) -> np.ndarray:
    """The state rows of one fragment's step records (its HAS_STATE rows, in order): the
    inverse of ``write_state``, [K, S] float32."""
    return steps["state"][(steps["flags"] & HAS_STATE) != 0]


def grid_rows(num_steps: int, max_seq_len: int) -> np.ndarray:
    """Fragment positions that carry the actor's state: 0, L, 2L, ... below T."""
    if max_seq_len < 1:
        raise ValueError(f"max_seq_len must be positive, not {max_seq_len}")
    return np.arange(0, num_steps, max_seq_len)


def write_obs(rec: np.ndarray, obs: Columns) -> None:
    """Copy observation columns into records' obs fields (each leaf in its own dtype)."""
    fields = rec["obs"]
    for key, column in obs.items():
        fields[field_name(key)] = column


def read_obs(rec: np.ndarray, space: Space) -> Columns:
    """The records' observation columns of ``space``, keyed by leaf key (views, no copy)."""
    return obs_columns(rec["obs"], space)


def obs_columns(obs: np.ndarray, space: Space) -> Columns:
    """A structured array of obs fields (``rec["obs"]``) as leaf columns (views)."""
    return {leaf.key: obs[field_name(leaf.key)] for leaf in space.leaves()}


def concat_records(parts: list[np.ndarray], dtype: np.dtype) -> np.ndarray:
    """Concatenate record arrays keeping the exact (padded) record dtype.

    ``np.concatenate`` would canonicalise a structured dtype and drop its padding.
    """
    out = np.empty(sum(len(p) for p in parts), dtype)
    start = 0
    for part in parts:
        out[start:start + len(part)] = part
        start += len(part)
    return out
