"""Training sequences of a recurrent policy (`connector.sequences`): chunks of at most L steps
cut at segment starts and on the state grid, padded and masked; the connector cuts runs on
the grid; and each chunk starts from the state the actor had BEFORE its first step."""
from __future__ import annotations

import numpy as np
import pytest

from rlinkd.client_lib.protocol.spaces import Box, Discrete
from rlinkd.daemon import batch_schema as schema
from rlinkd.daemon.connector import sequences as seqs
from rlinkd.daemon.connector.builder import BatchBuilder
from rlinkd.daemon.connector.pipeline import LearnerPipeline, PipelineContext, pipeline_for
from rlinkd.daemon.connector.segments import SegmentAssembler, grid_cut
from tests.recurrent_data import act_episode, fragment_records, noisy_weights, small_spec

DEFAULT = ("observations", "columns", "old_logp", "values", "gae", "normalize_advantages")


def test_chunks_start_at_segments_and_grid_rows_and_never_exceed_l():
    # two segments of 7 and 5 steps, L = 3; the first is a whole fragment (grid 0, 3, 6), the
    # second continues a fragment cut at its grid row 0 and carries grid rows 0 and 3
    has_state = np.zeros(12, bool)
    has_state[[0, 3, 6, 7, 10]] = True
    start = seqs.chunk_starts(np.array([7, 5]), has_state, 3)
    assert np.flatnonzero(start).tolist() == [0, 3, 6, 7, 10]
    index = seqs.chunk_index(start.astype(np.float32), 3)
    assert index.tolist() == [[0, 1, 2], [3, 4, 5], [6, -1, -1], [7, 8, 9], [10, 11, -1]]


def test_a_grid_sparser_than_l_still_gives_chunks_of_at_most_l():
    start = seqs.chunk_starts(np.array([7]), np.array([True] + [False] * 6), 3)
    assert np.flatnonzero(start).tolist() == [0, 3, 6]  # (rows 3 and 6 start from zeros)
    with pytest.raises(ValueError, match="longer than max_seq_len"):
        seqs.chunk_index(np.array([1, 0, 0, 0], np.float32), 3)


def test_start_states_episode_starts_and_the_time_major_round_trip():
    states = np.arange(12, dtype=np.float32).reshape(6, 2) + 1.0
    states[0] = 0.0                                     # an episode starts at row 0
    has_state = np.array([True, False, True, True, False, False])
    start = seqs.chunk_starts(np.array([2, 4]), has_state, 2)
    seq_state = seqs.start_states(states, has_state, start)
    assert seq_state.tolist() == [[0, 0], [0, 0], [5, 6], [7, 8], [0, 0], [0, 0]]
    assert seqs.episode_starts(np.array([2, 4]), seq_state).tolist() == [
        True, False, False, False, False, False]        # row 2 continues an episode
    index = seqs.chunk_index(start, 2)                  # [[0, 1], [2, -1], [3, 4], [5, -1]]
    column = np.arange(6.0)
    chunked = seqs.to_chunks(column, index)             # [L, C]
    assert chunked.tolist() == [[0, 2, 3, 5], [1, 0, 4, 0]]
    assert seqs.from_chunks(chunked, index, 6).tolist() == column.tolist()


def test_grid_cut_picks_the_last_grid_row_in_reach():
    has_state = np.zeros(20, bool)
    has_state[::4] = True
    assert grid_cut(has_state, 10) == 8 and grid_cut(has_state, 8) == 8
    assert grid_cut(np.zeros(20, bool), 10) == 10       # feed-forward: anywhere
    assert grid_cut(None, 10) == 10


def test_an_open_run_is_cut_on_the_grid_and_both_parts_start_with_a_state():
    spec = small_spec(max_seq_len=4)
    ep = act_episode(spec, noisy_weights(spec), 30, seed=1)
    rec = fragment_records(spec, ep, 0, 30, stream=2, terminated=True, first_ingest=1)
    asm = SegmentAssembler(max_open_steps=10)
    head = asm.add(rec[:11])                            # 11 open steps: cut at grid row 8
    assert [s.num_steps for s in head] == [8] and head[0].has_state[0]
    (tail,) = asm.add(rec[11:])
    assert tail.num_steps == 22 and tail.has_state[0]
    np.testing.assert_array_equal(tail.states[0], ep.states[8])


def test_the_builder_splits_an_oversized_segment_on_the_grid():
    spec = small_spec(max_seq_len=4)
    ep = act_episode(spec, noisy_weights(spec), 30, seed=1)
    (seg,) = SegmentAssembler().add(fragment_records(spec, ep, 0, 30, 2, True, 1))
    builder = BatchBuilder(train_batch_size=8, capacity_rows=14, max_policy_lag=None)
    builder.add([seg])
    plan = builder.take(current_seq=0, consumed_id=0)
    assert [s.num_steps for s in plan.segments] == [12]
    assert builder.buffered[0].has_state[0]             # the next batch begins on a grid row


def context(spec, flat, gamma=0.9, lam=0.8):
    return PipelineContext(Box((3,)), Discrete(2), spec, flat, 3, gamma, lam, False)


def acted_batch(spec, flat, cuts=(0, 6, 11), episode_steps=(11, 9)):
    """Episode 1 in two fragments cut at step 6 (off the grid of L=4 in fragment terms: the
    second fragment's grid restarts at its own step 0) and episode 2 in one fragment."""
    ep1 = act_episode(spec, flat, episode_steps[0], seed=1)
    ep2 = act_episode(spec, flat, episode_steps[1], seed=2)
    recs = [fragment_records(spec, ep1, cuts[0], cuts[1], 1, False, 1),
            fragment_records(spec, ep1, cuts[1], cuts[2], 1, True, 100),
            fragment_records(spec, ep2, 0, episode_steps[1], 2, False, 200)]
    segments = [s for r in recs for s in SegmentAssembler().add(r)]
    batch = LearnerPipeline(pipeline_for(DEFAULT, "ppo", recurrent=True))(segments, context(spec, flat))
    return batch, (ep1, ep2)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_the_first_state_of_every_sequence_is_the_actors_state_before_that_step(cell):
    spec = small_spec(cell, max_seq_len=4)
    flat = noisy_weights(spec)
    batch, (ep1, ep2) = acted_batch(spec, flat)
    starts = np.flatnonzero(batch["seq_start"])
    # fragment 1: steps 0..5 (grid 0, 4); fragment 2: steps 6..10 (grid 6, 10); episode 2: 0, 4, 8
    assert starts.tolist() == [0, 4, 6, 10, 11, 15, 19]
    actor_state = np.concatenate([ep1.states, ep2.states])          # before each step
    np.testing.assert_array_equal(batch["seq_state"][starts], actor_state[starts])
    assert batch["episode_start"].nonzero()[0].tolist() == [0, 11]
    # the connector's recurrent forward from those states reproduces the actor's values:
    # with the state AFTER a chunk's first step (the off-by-one) they would differ
    np.testing.assert_allclose(batch["values"], np.concatenate([ep1.values, ep2.values]),
                               rtol=1e-5, atol=1e-6)


def test_bootstrap_values_use_the_state_after_the_segments_last_step():
    spec = small_spec("lstm", max_seq_len=4)
    flat = noisy_weights(spec)
    batch, (ep1, _) = acted_batch(spec, flat)
    # row 5 ends the cut fragment: its next value is V(obs 6) from the state before step 6
    np.testing.assert_allclose(batch["next_values"][5], ep1.values[6], rtol=1e-5, atol=1e-6)


def test_a_recurrent_batch_fills_the_declared_slot_columns():
    spec = small_spec("gru", max_seq_len=4)
    batch, _ = acted_batch(spec, noisy_weights(spec))
    columns = schema.slot_columns(spec)
    assert set(schema.SEQUENCE_COLUMN_NAMES) < set(columns)
    assert columns["seq_state"] == ((spec.state_size,), "float32")
    views = {k: np.zeros((64, *shape), dtype) for k, (shape, dtype) in columns.items()}
    rows = schema.write_columns(views, batch, spec)
    back = schema.read_columns(views, rows, spec)
    np.testing.assert_array_equal(back["seq_state"], batch["seq_state"])
    feed_forward = small_spec("none")
    assert not set(schema.SEQUENCE_COLUMN_NAMES) & set(schema.slot_columns(feed_forward))


def test_pipeline_for_puts_sequences_after_columns_only_when_recurrent():
    assert pipeline_for(DEFAULT, "ppo") == DEFAULT
    names = pipeline_for(DEFAULT, "appo", recurrent=True)
    assert names[:3] == ("observations", "columns", "sequences") and "vtrace" in names
