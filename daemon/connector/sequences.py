"""Training sequences of a recurrent policy: a train batch's rows cut into chunks of at most
L = max_seq_len steps, each started from the state the actor really had. Pure numpy.

Rows are the batch's steps, segment after segment (one segment: consecutive steps of one
episode of one stream, in order). A chunk begins

* at the first row of every segment (a segment starts a fragment, or continues one the
  daemon cut on the state grid: that row carries the actor's state, zeros at an episode start);
* at every row flagged HAS_STATE (the fragment's grid rows 0, L, 2L, ...: the actor's state
  before that step);
* after L steps of a chunk (only when a client's grid is sparser than L: never with the
  collector's validation; such a chunk starts from zeros).

A chunk's start state is the stored state of its first row (zeros when that row has none):
the state BEFORE the chunk's first step, never the state after it. A chunk that starts an
episode (its start row is a segment start with an all-zero stored state) is flagged in
``starts`` so that `learner.recurrent.sequence` zeroes the state before that step.

The batch carries the chunks as per-row columns (``batch_schema``): ``seq_start`` (1 on a
chunk's first row), ``seq_state`` [N, S] (the start state on those rows, zeros elsewhere)
and ``episode_start`` (1 where an episode begins). ``chunk_index`` turns ``seq_start`` back
into a [C, L] row index with -1 padding; padded steps are masked out of every loss.
"""
from __future__ import annotations

import numpy as np


def chunk_starts(segment_lengths: np.ndarray, has_state: np.ndarray, max_seq_len: int) -> np.ndarray:
    """[N] bool, True on the first row of every chunk (the rules above). ``segment_lengths``
    [S] sum to N; ``has_state`` [N] marks the rows whose stored state is the actor's."""
    lengths = np.asarray(segment_lengths, np.int64)
    n = int(lengths.sum())
    first = np.zeros(n, bool)
    first[np.cumsum(lengths) - lengths] = True                       # segment starts
    marks = first | np.asarray(has_state, bool)                      # [N]
    out = marks.copy()
    since = 0
    for row in range(n):                                             # chunks of at most L
        since = 0 if marks[row] else since + 1
        if since == max_seq_len:
            out[row], since = True, 0
    return out


def chunk_index(seq_start: np.ndarray, max_seq_len: int) -> np.ndarray:
    """[C, L] int64 row of each chunk's steps, -1 after a chunk's end (padding), from the
    per-row chunk-start flags [N] (row 0 must start a chunk). ValueError when a chunk is
    longer than L or the first row starts none."""
    begins = np.flatnonzero(np.asarray(seq_start) > 0)               # [C]
    n = len(seq_start)
    if n and (not len(begins) or begins[0] != 0):
        raise ValueError("the first row of a batch must start a sequence")
    lengths = np.diff(np.append(begins, n))                          # [C]
    if len(lengths) and lengths.max() > max_seq_len:
        raise ValueError(f"a sequence of {int(lengths.max())} steps is longer than max_seq_len {max_seq_len}")
    steps = np.arange(max_seq_len)                                   # [L]
    rows = begins[:, None] + steps[None, :]                          # [C, L]
    return np.where(steps[None, :] < lengths[:, None], rows, -1)


def start_states(states: np.ndarray, has_state: np.ndarray, seq_start: np.ndarray) -> np.ndarray:
    """[N, S] float32: on each chunk's first row the stored state before that step (zeros
    where the row has none), zeros on every other row (the ``seq_state`` column)."""
    keep = np.asarray(seq_start, bool) & np.asarray(has_state, bool)  # [N]
    return np.where(keep[:, None], states, 0.0).astype(np.float32)


def episode_starts(segment_lengths: np.ndarray, seq_state: np.ndarray) -> np.ndarray:
    """[N] bool, True on a segment's first row whose stored state is all zeros (an episode
    start: the actor zeroes its state there, and no state after a step is exactly zero)."""
    lengths = np.asarray(segment_lengths, np.int64)
    out = np.zeros(len(seq_state), bool)
    first = np.cumsum(lengths) - lengths                             # [S]
    out[first] = ~np.any(seq_state[first] != 0.0, axis=1)
    return out


def to_chunks(column: np.ndarray, index: np.ndarray) -> np.ndarray:
    """A per-row column [N, ...] as [L, C, ...] (time major), zeros at padded steps."""
    out = np.asarray(column)[np.maximum(index, 0)]                   # [C, L, ...]
    out[index < 0] = 0
    return np.swapaxes(out, 0, 1)


def from_chunks(chunked: np.ndarray, index: np.ndarray, rows: int) -> np.ndarray:
    """[L, C, ...] back to the per-row [N, ...] (padded steps dropped)."""
    flat_index = np.swapaxes(index, 0, 1).reshape(-1)                # [L*C]
    flat = chunked.reshape(-1, *chunked.shape[2:])
    out = np.empty((rows, *chunked.shape[2:]), chunked.dtype)
    out[flat_index[flat_index >= 0]] = flat[flat_index >= 0]
    return out
