"""daemon.connector: segment assembly, batch building (cutoff contract), learner pipeline."""
from __future__ import annotations

import random
from typing import ClassVar

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlinkd.client_lib.protocol import policy_spec as ps
from rlinkd.client_lib.protocol.fragments import Fragment
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.records import fragment_records
from rlinkd.client_lib.protocol.spaces import Box, Dict, Discrete, Space, record_fields
from rlinkd.daemon.connector import pipeline as pipeline_mod
from rlinkd.daemon.connector.builder import BatchBuilder, behaviour_versions
from rlinkd.daemon.connector.pipeline import LearnerPipeline, PipelineContext, load_piece
from rlinkd.daemon.connector.segments import Segment, SegmentAssembler, split_segment
from rlinkd.daemon.errors import ConfigError
from rlinkd.shm.records import FLUSH, StepLayout

OBS = Box([2], low=-10.0, high=10.0)
ACT = Discrete(3)
LAYOUT = StepLayout.flat(2, 1, 0)
DEFAULT_PIECES = ("observations", "columns", "old_logp", "values", "gae", "normalize_advantages")


# ---------------------------------------------------------------- helpers
def make_fragment(rng: np.random.Generator, t: int, *, terminated=False, truncated=False,
                  logp=True) -> Fragment:
    """A validated (canonical) fragment of OBS/ACT: obs columns and float32 action indices."""
    return Fragment(
        obs={"": rng.uniform(-1, 1, (t + 1, 2)).astype(np.float32)},
        actions=rng.integers(0, 3, (t, 1)).astype(np.float32),
        rewards=rng.normal(size=t), is_terminated=terminated, is_truncated=truncated,
        action_logp=-rng.uniform(0.1, 2.0, t) if logp else None)


def with_ids(rec: np.ndarray, first_id: int) -> np.ndarray:
    rec["ingest_id"] = np.arange(first_id, first_id + len(rec))
    return rec


def segment(t: int, first_id: int = 1, seq: int = 0, stream: int = 1, *, terminated=False,
            truncated=False, seed: int = 0) -> Segment:
    rng = np.random.default_rng(seed + first_id)
    f = make_fragment(rng, t, terminated=terminated, truncated=truncated)
    rec = with_ids(fragment_records(f, LAYOUT, stream, seq), first_id)
    return SegmentAssembler().add(rec)[0]


def flush_marker(last_id: int) -> np.ndarray:
    rec = LAYOUT.empty(1)
    rec["flags"], rec["ingest_id"] = FLUSH, last_id
    return rec


# ---------------------------------------------------------------- segments
def test_segment_from_one_fragment():
    rng = np.random.default_rng(1)
    f = make_fragment(rng, 3, terminated=True)
    rec = with_ids(fragment_records(f, LAYOUT, stream_id=4, weights_seq_no=6), 10)
    (seg,) = SegmentAssembler().add(rec)
    assert seg.stream_id == 4 and seg.num_steps == 3 and seg.terminated and not seg.truncated
    np.testing.assert_array_equal(seg.obs["obs"], f.obs[""])
    np.testing.assert_array_equal(seg.actions, f.actions)
    np.testing.assert_allclose(seg.rewards, f.rewards, rtol=1e-6)
    np.testing.assert_allclose(seg.logp, f.action_logp, rtol=1e-6)
    assert seg.has_logp.tolist() == [True] * 3
    assert seg.ingest_ids.tolist() == [10, 11, 12, 13] and seg.first_ingest_id == 10
    assert seg.behaviour_seq_no == 6


def test_behaviour_seq_no_is_the_oldest_known_policy():
    rng = np.random.default_rng(2)
    rec = with_ids(fragment_records(make_fragment(rng, 3), LAYOUT, 1, 0), 1)
    rec["weights_seq_no"][:3] = [-1, 7, 5]
    rec["weights_seq_no"][3] = 2  # the final obs record did not act: ignored
    assert SegmentAssembler().add(rec)[0].behaviour_seq_no == 5
    rec["weights_seq_no"][:3] = -1
    assert SegmentAssembler().add(rec)[0].behaviour_seq_no == -1


def _interleave(per_stream: dict[int, list[np.ndarray]], rnd: random.Random) -> np.ndarray:
    """Merge the streams' record arrays in a random order that keeps each stream's order."""
    queues = {s: list(np.concatenate(parts)) for s, parts in per_stream.items()}
    out = []
    while queues:
        s = rnd.choice(sorted(queues))
        out.append(queues[s].pop(0))
        if not queues[s]:
            del queues[s]
    return np.array(out, dtype=LAYOUT.dtype)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_streams=st.integers(1, 4))
def test_interleaved_streams_with_flush_markers(seed, n_streams):
    rnd, rng = random.Random(seed), np.random.default_rng(seed)
    expected = []                      # (stream, fragment) in per-stream order
    per_stream: dict[int, list[np.ndarray]] = {}
    for stream in range(1, n_streams + 1):
        for _ in range(rnd.randint(1, 3)):
            end = rnd.choice(["terminated", "truncated", "cut"])
            f = make_fragment(rng, rnd.randint(0, 5), terminated=end == "terminated",
                              truncated=end == "truncated", logp=rnd.random() < 0.5)
            rec = fragment_records(f, LAYOUT, stream, 3)
            rec["weights_seq_no"] = rng.integers(-1, 9, len(rec))  # (oldest known: the behaviour)
            per_stream.setdefault(stream, []).append(rec)
            known = rec["weights_seq_no"][:-1][rec["weights_seq_no"][:-1] >= 0]
            expected.append((stream, f, int(known.min()) if known.size else -1))
    ring = with_ids(_interleave(per_stream, rnd), 1)
    # ring order, cut into random chunks, with FLUSH markers slipped in between chunks
    asm, got, flushes = SegmentAssembler(), [], 0
    pos = 0
    while pos < len(ring):
        n = rnd.randint(1, 6)
        chunk = ring[pos:pos + n]
        pos += n
        if rnd.random() < 0.3:
            chunk = np.concatenate([chunk, flush_marker(int(chunk["ingest_id"][-1]))])
            flushes += 1
        done = asm.add(chunk)
        assert [s.first_ingest_id for s in done] == sorted(s.first_ingest_id for s in done)
        got.extend(done)
    assert asm.flush_requested == (flushes > 0)
    assert asm.open_steps() == 0 and asm.max_ingest_id == len(ring)
    assert len(got) == len(expected)
    for stream in range(1, n_streams + 1):
        segs = sorted((s for s in got if s.stream_id == stream), key=lambda s: s.first_ingest_id)
        frags = [(f, oldest) for s, f, oldest in expected if s == stream]
        assert len(segs) == len(frags)
        for seg, (f, oldest) in zip(segs, frags):
            assert seg.num_steps == f.num_steps and len(seg.obs) == f.num_steps + 1
            np.testing.assert_array_equal(seg.obs["obs"], f.obs[""])
            np.testing.assert_array_equal(seg.actions, f.actions)
            assert (seg.terminated, seg.truncated) == (f.is_terminated, f.is_truncated)
            assert seg.has_logp.tolist() == [f.action_logp is not None] * f.num_steps
            np.testing.assert_allclose(seg.rewards, f.rewards, rtol=1e-6)
            if f.action_logp is not None:
                np.testing.assert_allclose(seg.logp, f.action_logp, rtol=1e-6)
            assert seg.behaviour_seq_no == oldest
            assert (np.diff(seg.ingest_ids) > 0).all()
            assert ring["stream_id"][seg.ingest_ids - 1].tolist() == [stream] * len(seg.obs)


def test_flush_marker_alone_sets_the_flag_and_yields_nothing():
    asm = SegmentAssembler()
    assert asm.add(flush_marker(0)) == [] and asm.flush_requested
    assert asm.add(LAYOUT.empty(0)) == []


def test_open_steps():
    rng = np.random.default_rng(3)
    rec = with_ids(fragment_records(make_fragment(rng, 4), LAYOUT, 2, 0), 1)
    asm = SegmentAssembler()
    assert asm.add(rec[:3]) == [] and asm.open_steps() == 3


def test_split_segment():
    seg = segment(5, first_id=20, terminated=True)
    head, tail = split_segment(seg, 2)
    assert head.num_steps == 2 and tail.num_steps == 3
    assert not head.terminated and not head.truncated and tail.terminated
    np.testing.assert_array_equal(head.obs, seg.obs[:3])
    np.testing.assert_array_equal(tail.obs, seg.obs[2:])  # head bootstraps from tail's first obs
    np.testing.assert_array_equal(np.concatenate([head.rewards, tail.rewards]), seg.rewards)
    np.testing.assert_array_equal(np.concatenate([head.actions, tail.actions]), seg.actions)
    np.testing.assert_array_equal(np.concatenate([head.logp, tail.logp]), seg.logp)
    assert head.ingest_ids.tolist() == [20, 21, 22] and tail.ingest_ids.tolist() == [22, 23, 24, 25]
    assert head.behaviour_seq_no == tail.behaviour_seq_no == seg.behaviour_seq_no


# ---------------------------------------------------------------- BatchBuilder
def test_builder_ignores_empty_segments():
    b = BatchBuilder(train_batch_size=4, capacity_rows=16, max_policy_lag=2)
    b.add([segment(0), segment(3, first_id=5)])
    assert len(b.buffered) == 1 and b.buffered_steps == 3


def test_should_build_rules():
    b = BatchBuilder(train_batch_size=10, capacity_rows=40, max_policy_lag=2)
    assert not b.should_build(flush_requested=False, learner_idle=True, consumed_id=0)
    assert not b.should_build(flush_requested=True, learner_idle=True, consumed_id=0)
    assert b.should_build(flush_requested=True, learner_idle=True, consumed_id=1)  # empty flush
    assert not b.should_build(flush_requested=True, learner_idle=False, consumed_id=1)
    b.add([segment(6)])
    assert not b.should_build(False, True, 7)
    assert b.should_build(True, True, 7)
    b.add([segment(4, first_id=8)])                     # 10 = train_batch_size
    assert b.should_build(False, True, 12)
    assert not b.should_build(False, False, 12)         # learner busy: keep accumulating
    b.add([segment(10, first_id=13)])                   # 20 = capacity // 2: about to overflow
    assert b.should_build(False, False, 23)


def test_take_respects_capacity_and_order():
    b = BatchBuilder(train_batch_size=4, capacity_rows=8, max_policy_lag=5)
    segs = [segment(3, 1), segment(4, 5), segment(2, 10), segment(1, 13)]
    b.add(segs)
    plan = b.take(current_seq=0, consumed_id=14)
    assert [s.first_ingest_id for s in plan.segments] == [1, 5]  # 7 rows; the next would be 9
    assert plan.cutoff == 9 and plan.dropped_episodes == 0
    assert b.buffered_steps == 3 and b.trained_steps == 7 and b.batches == 1
    plan = b.take(current_seq=0, consumed_id=14)
    assert [s.first_ingest_id for s in plan.segments] == [10, 13] and plan.cutoff == 14
    assert b.buffered == [] and b.buffered_steps == 0


def test_take_splits_a_segment_larger_than_a_slot():
    b = BatchBuilder(train_batch_size=4, capacity_rows=4, max_policy_lag=5)
    b.add([segment(10, first_id=1, terminated=True)])
    plan = b.take(0, consumed_id=11)
    assert len(plan.segments) == 1 and plan.segments[0].num_steps == 4
    assert not plan.segments[0].terminated
    assert plan.cutoff == 4                 # the tail starts at the head's bootstrap obs (id 5)
    rows = [p.num_steps for p in (b.take(0, 11).segments + b.take(0, 11).segments)]
    assert rows == [4, 2] and b.buffered == [] and b.take(0, 11).cutoff == 11


def test_policy_lag_drops_are_counted():
    b = BatchBuilder(train_batch_size=4, capacity_rows=100, max_policy_lag=2)
    b.add([segment(3, 1, seq=7), segment(4, 5, seq=8), segment(2, 10, seq=-1),
           segment(5, 13, seq=6)])
    plan = b.take(current_seq=10, consumed_id=18)
    assert [s.first_ingest_id for s in plan.segments] == [5, 10]
    assert plan.dropped_episodes == 2 and b.dropped_episodes == 2 and b.dropped_steps == 8
    assert plan.cutoff == 18 and b.trained_steps == 6


def test_on_policy_builder_never_drops_for_lag():
    """force_on_policy: every client is promised weights trained on its episodes."""
    b = BatchBuilder(train_batch_size=4, capacity_rows=100, max_policy_lag=None)
    b.add([segment(3, 1, seq=0), segment(4, 5, seq=8)])
    plan = b.take(current_seq=50, consumed_id=9)
    assert [s.first_ingest_id for s in plan.segments] == [1, 5]
    assert plan.dropped_episodes == 0 and b.dropped_episodes == 0 and b.trained_steps == 7


def test_behaviour_versions_summarise_the_known_versions_of_a_batch():
    segs = [segment(3, 1, seq=7), segment(4, 5, seq=10), segment(2, 10, seq=-1)]
    assert behaviour_versions(segs) == (7, 3 * 7 + 4 * 10, 7)   # the unknown version is left out
    assert behaviour_versions([segment(2, 10, seq=-1)]) == (-1, 0, 0)


def test_cutoff_is_the_first_remaining_id_minus_one():
    b = BatchBuilder(train_batch_size=1, capacity_rows=3, max_policy_lag=5)
    b.add([segment(2, first_id=1)])
    assert b.take(0, consumed_id=3).cutoff == 3           # nothing left: all consumed ids
    b.add([segment(3, first_id=4, stream=2), segment(2, first_id=20)])
    assert b.take(0, consumed_id=22).cutoff == 19         # 20.. stays buffered
    b.add([segment(2, first_id=30)])
    assert b.take(0, consumed_id=32).cutoff == 29


def test_cutoff_never_goes_backwards():
    b = BatchBuilder(train_batch_size=1, capacity_rows=3, max_policy_lag=5)
    assert b.take(0, consumed_id=50).cutoff == 50         # empty flush batch
    # a long segment that started at id 10 completes only now and must be split
    b.add([segment(6, first_id=10, stream=2)])
    plan = b.take(0, consumed_id=60)
    assert plan.segments[0].num_steps == 3 and b.buffered[0].first_ingest_id == 13
    assert plan.cutoff == 50 and b.last_cutoff == 50


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), capacity=st.integers(1, 12), lag=st.integers(0, 3))
def test_cutoff_contract(seed, capacity, lag):
    """Every complete segment whose ingest ids are all <= cutoff is in this or an earlier batch,
    or was dropped for policy lag; and no batch exceeds the slot capacity."""
    rnd, rng = random.Random(seed), np.random.default_rng(seed)
    per_stream: dict[int, list[np.ndarray]] = {}
    for stream in range(1, rnd.randint(1, 4) + 1):
        for _ in range(rnd.randint(1, 4)):
            f = make_fragment(rng, rnd.randint(0, 8), terminated=rnd.random() < 0.5)
            per_stream.setdefault(stream, []).append(
                fragment_records(f, LAYOUT, stream, rnd.randint(-1, 6)))
    ring = with_ids(_interleave(per_stream, rnd), 1)
    asm = SegmentAssembler()
    b = BatchBuilder(train_batch_size=rnd.randint(1, 10), capacity_rows=capacity,
                     max_policy_lag=lag)
    complete: list[Segment] = []
    handled: set[int] = set()          # ingest ids of steps trained on or dropped
    pos, seq, last_cutoff = 0, 0, 0
    while pos < len(ring) or b.buffered:
        n = rnd.randint(0, 5)
        new = asm.add(ring[pos:pos + n])
        pos += n
        complete.extend(s for s in new)
        b.add(new)
        if rnd.random() < 0.5:
            seq += rnd.randint(0, 2)
            stale = [s for s in b.buffered
                     if s.behaviour_seq_no >= 0 and seq - s.behaviour_seq_no > lag]
            plan = b.take(seq, asm.max_ingest_id)
            assert plan.dropped_episodes == len(stale)
            assert sum(s.num_steps for s in plan.segments) <= capacity
            for s in stale + plan.segments:
                handled.update(s.ingest_ids[:-1].tolist())
            assert last_cutoff <= plan.cutoff <= asm.max_ingest_id
            last_cutoff = plan.cutoff
            for s in complete:
                if s.ingest_ids.max() <= plan.cutoff:
                    assert set(s.ingest_ids[:-1].tolist()) <= handled, (
                        f"segment {s.ingest_ids.tolist()} below cutoff {plan.cutoff} lost")
    # at the end everything was either trained or dropped
    all_steps = {i for s in complete for i in s.ingest_ids[:-1].tolist()}
    assert all_steps <= handled
    assert b.trained_steps + b.dropped_steps == len(all_steps)


# ---------------------------------------------------------------- pipeline
SPEC = PolicySpec(OBS, ACT, hidden_sizes=(8, 8))
WEIGHTS = SPEC.init_flat(np.random.default_rng(7))
# a critic head with real weights (init uses gain 1.0 but biases are 0; make V clearly non-zero)
SPEC.split_flat(WEIGHTS)["vf.2.bias"][:] = 0.75


def ctx(spec=SPEC, weights=WEIGHTS, obs_space=OBS, act_space=ACT, gamma=0.9, lam=0.8,
        normalize=False) -> PipelineContext:
    return PipelineContext(obs_space, act_space, spec, weights, 3, gamma, lam, normalize)


def three_segments() -> list[Segment]:
    cut = segment(3, first_id=1, seed=11)                       # neither: bootstrap
    cut.has_logp = np.array([True, False, True])
    cut.logp = np.array([-0.25, 99.0, -0.75], np.float32)       # 99 = garbage where missing
    term = segment(2, first_id=5, terminated=True, seed=12)     # no bootstrap
    trunc = segment(1, first_id=8, truncated=True, seed=13)     # bootstrap
    return [cut, term, trunc]


def expected_gae(segments, gamma, lam, rewards_scale=1.0):
    """Per-segment GAE with explicit loops and the same numpy value function."""
    adv_all, tgt_all = [], []
    for s in segments:
        values = SPEC.value_forward(WEIGHTS, s.obs["obs"][:-1]).astype(np.float64)
        v_final = float(SPEC.value_forward(WEIGHTS, s.obs["obs"][-1:])[0])
        boot = 0.0 if s.terminated else v_final
        nxt = np.append(values[1:], boot)
        r = s.rewards.astype(np.float64) * rewards_scale
        adv, acc = np.zeros(len(r)), 0.0
        for t in reversed(range(len(r))):
            acc = r[t] + gamma * nxt[t] - values[t] + gamma * lam * acc
            adv[t] = acc
        adv_all.append(adv)
        tgt_all.append(adv + values)
    return np.concatenate(adv_all), np.concatenate(tgt_all)


def test_pipeline_columns_and_gae_bootstrap():
    segs = three_segments()
    batch = LearnerPipeline(DEFAULT_PIECES)(segs, ctx())
    n = 6
    assert list(batch["obs"]) == [""] and list(batch["final_obs"]) == [""]
    assert batch["obs"][""].shape == (n, 2) and batch["obs"][""].dtype == np.float32
    assert batch["final_obs"][""].shape == (3, 2)
    assert batch["actions"].shape == (n, 1) and batch["rewards"].shape == (n,)
    assert batch["segment_end"].tolist() == [False, False, True, False, True, True]
    assert batch["terminated"].tolist() == [False, False, False, False, True, False]
    assert batch["segment_lengths"].tolist() == [3, 2, 1]
    np.testing.assert_array_equal(batch["obs"][""][3:5], segs[1].obs["obs"][:-1])
    np.testing.assert_array_equal(batch["final_obs"][""][1], segs[1].obs["obs"][-1])

    v_final = [float(SPEC.value_forward(WEIGHTS, s.obs["obs"][-1:])[0]) for s in segs]
    values = np.concatenate([SPEC.value_forward(WEIGHTS, s.obs["obs"][:-1]) for s in segs])
    np.testing.assert_allclose(batch["values"], values, rtol=1e-6)
    # next_values: V(final obs) at every segment end (the terminated one is zeroed in GAE)
    np.testing.assert_allclose(batch["next_values"][[2, 4, 5]], v_final, rtol=1e-6)
    np.testing.assert_allclose(batch["next_values"][[0, 1, 3]], values[[1, 2, 4]], rtol=1e-6)

    adv, targets = expected_gae(segs, 0.9, 0.8)
    np.testing.assert_allclose(batch["advantages"], adv, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(batch["value_targets"], targets, rtol=1e-5, atol=1e-6)
    # explicitly: the cut segment's last step bootstraps, the terminated one's does not
    r = batch["rewards"].astype(np.float64)
    assert batch["advantages"][2] == pytest.approx(r[2] + 0.9 * v_final[0] - values[2], rel=1e-5)
    assert batch["advantages"][4] == pytest.approx(r[4] - values[4], rel=1e-5)
    assert batch["advantages"][5] == pytest.approx(r[5] + 0.9 * v_final[2] - values[5], rel=1e-5)
    assert abs(v_final[1]) > 0.1  # so leaving the bootstrap in would have been visible


def test_old_logp_recomputed_only_where_missing():
    segs = three_segments()
    batch = LearnerPipeline(DEFAULT_PIECES)(segs, ctx())
    obs = np.concatenate([s.obs["obs"][:-1] for s in segs])
    acts = np.concatenate([s.actions for s in segs])
    assert acts.shape == (6, 1) and acts.dtype == np.float32  # index vectors
    dist = SPEC.actor_forward(WEIGHTS, obs)
    fresh = SPEC.log_prob(dist, acts)
    has = np.concatenate([s.has_logp for s in segs])
    assert has.tolist() == [True, False, True, True, True, True]
    given = np.concatenate([s.logp for s in segs])
    np.testing.assert_array_equal(batch["logp"][has], given[has])        # client's, untouched
    np.testing.assert_allclose(batch["logp"][1], fresh[1], rtol=1e-6)    # recomputed
    assert batch["logp"][1] < 0 and batch["logp"].dtype == np.float32


def test_old_logp_not_recomputed_when_all_present(monkeypatch):
    def forbidden(*a, **k):
        raise AssertionError("actor_forward must not run when every logp is known")

    monkeypatch.setattr(pipeline_mod.ps, "actor_forward", forbidden)
    segs = [segment(3, 1, seed=4), segment(2, 5, terminated=True, seed=5)]
    batch = LearnerPipeline(DEFAULT_PIECES)(segs, ctx())
    np.testing.assert_array_equal(batch["logp"], np.concatenate([s.logp for s in segs]))


def structured_obs(space: Space, columns: dict[str, np.ndarray]) -> np.ndarray:
    """A segment's obs as the records hold it: a structured array, one field per leaf."""
    fields = record_fields(space)
    out = np.zeros(len(next(iter(columns.values()))), [(n, d, shape) for n, d, shape in fields])
    for (name, _, _), leaf in zip(fields, space.leaves()):
        out[name] = columns[leaf.key]
    return out


def test_box_actions_logp_recomputed():
    act = Box([2], low=-1.0, high=1.0)
    spec = PolicySpec(OBS, act, hidden_sizes=(4,))
    weights = spec.init_flat(np.random.default_rng(0))
    seg = Segment(stream_id=1, obs=structured_obs(OBS, {"": np.float32([[0, 0], [0.5, 0.5], [1, 1]])}),
                  actions=np.float32([[0.1, -0.2], [0.9, 0.0]]), rewards=np.float32([1, 2]),
                  logp=np.zeros(2, np.float32), has_logp=np.array([False, False]),
                  terminated=False, truncated=True, behaviour_seq_no=0,
                  ingest_ids=np.arange(1, 4))
    batch = LearnerPipeline(DEFAULT_PIECES)([seg], ctx(spec, weights, act_space=act))
    expected = spec.log_prob(spec.actor_forward(weights, seg.obs["obs"][:-1]), seg.actions)
    np.testing.assert_allclose(batch["logp"], expected, rtol=1e-6)


def test_discrete_observations_stay_values_and_the_network_sees_them_one_hot():
    """The batch carries Discrete observations as their int64 values (one-hot encoding is the
    network's first op now); the values match an MLP on the one-hot features."""
    obs_space = Discrete(4)
    spec = PolicySpec(obs_space, ACT, hidden_sizes=(4,))
    weights = spec.init_flat(np.random.default_rng(1))
    seg = Segment(stream_id=1, obs=structured_obs(obs_space, {"": np.int64([3, 0, 2])}),
                  actions=np.float32([[1], [2]]),
                  rewards=np.float32([1, 1]), logp=np.float32([-1, -1]),
                  has_logp=np.array([True, True]), terminated=True, truncated=False,
                  behaviour_seq_no=0, ingest_ids=np.arange(1, 4))
    batch = LearnerPipeline(DEFAULT_PIECES)([seg], ctx(spec, weights, obs_space=obs_space))
    assert batch["obs"][""].dtype == np.int64
    np.testing.assert_array_equal(batch["obs"][""], [3, 0])
    np.testing.assert_array_equal(batch["final_obs"][""], [2])
    # the same trunk on explicit one-hot features (a Box spec with identity normaliser)
    one_hot_spec = PolicySpec(Box([4], low=0.0, high=1.0), ACT, hidden_sizes=(4,))
    one_hot_weights = one_hot_spec.init_flat(np.random.default_rng(2))
    mine, theirs = spec.split_flat(weights), one_hot_spec.split_flat(one_hot_weights)
    for name in mine:
        theirs[name][...] = mine[name]
    np.testing.assert_allclose(batch["values"], one_hot_spec.value_forward(
        one_hot_weights, np.float32([[0, 0, 0, 1], [1, 0, 0, 0]])), rtol=1e-6)


def test_normalize_advantages_piece():
    segs = three_segments()
    raw = LearnerPipeline(DEFAULT_PIECES)(segs, ctx(normalize=False))["advantages"]
    norm = LearnerPipeline(DEFAULT_PIECES)(segs, ctx(normalize=True))["advantages"]
    assert norm.dtype == np.float32
    assert norm.mean() == pytest.approx(0.0, abs=1e-5) and norm.std() == pytest.approx(1.0, abs=1e-4)
    np.testing.assert_allclose(norm, (raw - raw.mean()) / (raw.std() + 1e-8), rtol=1e-4, atol=1e-5)


def test_pipeline_end_to_end_from_ring_records():
    rng = np.random.default_rng(21)
    frags = [make_fragment(rng, 4), make_fragment(rng, 3, terminated=True)]
    rec = np.concatenate([fragment_records(frags[0], LAYOUT, 1, 0),
                          fragment_records(frags[1], LAYOUT, 2, 0)])
    asm, b = SegmentAssembler(), BatchBuilder(train_batch_size=7, capacity_rows=64,
                                              max_policy_lag=1)
    b.add(asm.add(with_ids(rec, 1)))
    assert b.should_build(asm.flush_requested, True, asm.max_ingest_id)
    plan = b.take(0, asm.max_ingest_id)
    assert plan.cutoff == len(rec)
    batch = LearnerPipeline(DEFAULT_PIECES)(plan.segments, ctx())
    adv, targets = expected_gae(plan.segments, 0.9, 0.8)
    assert len(batch["advantages"]) == 7
    np.testing.assert_allclose(batch["advantages"], adv, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(batch["value_targets"], targets, rtol=1e-5, atol=1e-6)
    obs = np.concatenate([f.obs[""][:-1] for f in frags])
    np.testing.assert_array_equal(batch["obs"][""], obs)


def test_composite_observations_keep_their_leaf_dtypes_through_the_pipeline():
    obs_space = Dict({"camera": Box([6, 6, 1], "uint8", 0, 255), "mode": Discrete(3),
                      "pos": Box([2], low=-1.0, high=1.0)})
    spec = PolicySpec(obs_space, ACT, hidden_sizes=(8,))
    weights = spec.init_flat(np.random.default_rng(3))
    layout = StepLayout(record_fields(obs_space), 1, 0)
    rng = np.random.default_rng(4)
    frags = [Fragment(obs={"camera": rng.integers(0, 256, (t + 1, 6, 6, 1)).astype(np.uint8),
                           "mode": rng.integers(0, 3, t + 1),
                           "pos": rng.uniform(-1, 1, (t + 1, 2)).astype(np.float32)},
                      actions=rng.integers(0, 3, (t, 1)).astype(np.float32), rewards=np.ones(t),
                      is_terminated=True, is_truncated=False) for t in (3, 2)]
    rec = np.concatenate([fragment_records(f, layout, i + 1, 0) for i, f in enumerate(frags)])
    segs = SegmentAssembler().add(with_ids(rec, 1))
    batch = LearnerPipeline(DEFAULT_PIECES)(segs, ctx(spec, weights, obs_space=obs_space))
    assert list(batch["obs"]) == ["camera", "mode", "pos"]
    for key, dtype in (("camera", np.uint8), ("mode", np.int64), ("pos", np.float32)):
        assert batch["obs"][key].dtype == dtype
        np.testing.assert_array_equal(batch["obs"][key], np.concatenate([f.obs[key][:-1] for f in frags]))
        np.testing.assert_array_equal(batch["final_obs"][key], np.stack([f.obs[key][-1] for f in frags]))
    np.testing.assert_allclose(batch["values"], spec.value_forward(weights, batch["obs"]), rtol=1e-6)
    assert np.isfinite(batch["logp"]).all() and batch["logp"].shape == (5,)


# ---------------------------------------------------------------- user pieces
class DoubleRewards:
    """A user piece: records what it saw, doubles the rewards (before GAE)."""

    seen: ClassVar[list[list[str]]] = []  # shared: the pipeline makes the instance

    def __call__(self, batch, segments, ctx):
        DoubleRewards.seen.append(sorted(batch))
        batch["rewards"] = batch["rewards"] * 2
        return batch


def add_marker(batch, segments, ctx):
    """A user piece given as a plain function."""
    batch["marker"] = np.full(len(batch["advantages"]), ctx.weights_seq_no)
    return batch


def test_user_piece_loaded_by_import_path_runs_in_order():
    DoubleRewards.seen.clear()
    names = ("observations", "columns", f"{__name__}:DoubleRewards", "old_logp", "values",
             "gae", f"{__name__}:add_marker")
    pipe = LearnerPipeline(names)
    assert isinstance(pipe.pieces[2], DoubleRewards) and pipe.pieces[6] is add_marker
    segs = three_segments()
    batch = pipe(segs, ctx())
    assert DoubleRewards.seen == [["actions", "final_obs", "obs", "rewards", "segment_end",
                                   "segment_lengths", "terminated"]]
    adv, _ = expected_gae(segs, 0.9, 0.8, rewards_scale=2.0)
    np.testing.assert_allclose(batch["advantages"], adv, rtol=1e-5, atol=1e-6)
    assert batch["marker"].tolist() == [3] * 6


@pytest.mark.parametrize("name, pattern", [
    ("nosuch", r"unknown piece 'nosuch'"),
    ("no_such_module_rlinkd_xyz:Piece", r"cannot load 'no_such_module_rlinkd_xyz:Piece'"),
    (f"{__name__}:NoSuchPiece", r"cannot load"),
])
def test_unknown_piece_is_a_config_error(name, pattern):
    with pytest.raises(ConfigError, match=pattern):
        LearnerPipeline(("observations", name))
    with pytest.raises(ConfigError):
        load_piece(name)


def test_builtin_pieces_by_name():
    assert load_piece("gae") is pipeline_mod.add_gae
    assert [p.__name__ for p in LearnerPipeline(DEFAULT_PIECES).pieces] == [
        "add_observations", "add_columns", "add_old_logp", "add_values", "add_gae",
        "normalize_advantages"]


def test_ps_module_functions_match_the_spec_methods():
    obs = np.random.default_rng(0).uniform(-1, 1, (5, 2))
    np.testing.assert_array_equal(ps.value_forward(SPEC, WEIGHTS, obs),
                                  SPEC.value_forward(WEIGHTS, obs))


def test_an_appo_builder_keeps_the_freshest_steps_within_its_capacity():
    """Nobody waits for APPO's steps: the oldest are dropped, counted, so the learner never
    trains on a stale backlog; other builders drop nothing here."""
    b = BatchBuilder(train_batch_size=6, capacity_rows=20, max_policy_lag=5, freshest=True)
    assert b.drains_freely
    b.add([segment(4, first_id=1), segment(4, first_id=10), segment(4, first_id=20)])
    assert b.buffered_steps == 8 and b.dropped_episodes == 1 and b.dropped_steps == 4
    assert [s.first_ingest_id for s in b.buffered] == [10, 20]  # >= 6 steps, the newest
    keep = BatchBuilder(train_batch_size=4, capacity_rows=10, max_policy_lag=5)
    keep.add([segment(4, first_id=1), segment(4, first_id=10), segment(4, first_id=20)])
    assert keep.buffered_steps == 12 and keep.dropped_steps == 0 and not keep.drains_freely
