"""Fragment validation and episode continuation (daemon.collector.ingest), step records (protocol.records)."""
from __future__ import annotations

import numpy as np
import pytest

from rlinkd.client_lib.protocol.codec import BadMessage, EpisodeFragment
from rlinkd.client_lib.protocol.records import fragment_records
from rlinkd.client_lib.protocol.spaces import SpaceSpec
from rlinkd.daemon.collector.ingest import (EpisodeStats, EpisodeTracker, InvalidEpisode, Limits,
                                     validate_fragment)
from rlinkd.shm.records import FINAL_OBS, HAS_DIST, HAS_LOGP, TERMINATED, TRUNCATED, StepLayout

OBS = SpaceSpec.box([2], -10.0, 10.0)
ACT = SpaceSpec.discrete(3)
BOX_ACT = SpaceSpec.box([2], -1.0, 1.0)
DIST = 3
LIMITS = Limits(max_episode_steps=50, max_obs_floats=100)
LAYOUT = StepLayout.flat(2, 1, DIST)


def fragment(t: int = 3, *, obs=None, actions=None, rewards=None, terminated=False,
             truncated=False, logp=None, dist=None) -> EpisodeFragment:
    obs = np.arange((t + 1) * 2, dtype=np.float64).reshape(t + 1, 2) / 4 if obs is None else obs
    return EpisodeFragment(
        obs=np.asarray(obs, np.float64),
        actions=np.asarray(np.arange(t) % 3 if actions is None else actions, np.float64),
        rewards=np.asarray(np.arange(1, t + 1) / 2 if rewards is None else rewards, np.float64),
        is_terminated=terminated, is_truncated=truncated,
        action_logp=None if logp is None else np.asarray(logp, np.float64),
        action_dist_inputs=None if dist is None else np.asarray(dist, np.float64))


def validate(frag, obs_space=OBS, act_space=ACT, dist_size=DIST, limits=LIMITS):
    return validate_fragment(frag, obs_space, act_space, dist_size, limits, "episodes[0]")


# ---------------------------------------------------------------- validate_fragment
def test_valid_fragment_passes_unchanged():
    f = fragment(3, logp=[-1.0, -0.5, -0.1], dist=np.zeros((3, DIST)))
    out = validate(f)
    np.testing.assert_array_equal(out.obs, f.obs)
    np.testing.assert_array_equal(out.actions, f.actions)
    np.testing.assert_array_equal(out.action_logp, f.action_logp)
    assert out.is_terminated is False and out.is_truncated is False


def test_invalid_episode_is_a_bad_message():
    assert issubclass(InvalidEpisode, BadMessage)


@pytest.mark.parametrize("kw, pattern", [
    (dict(t=51), r"episodes\[0\]: 51 steps exceed max_episode_steps=50"),
    (dict(obs=[[0, 0], [11, 0], [0, 0], [0, 0]]), r"episodes\[0\]\.obs: values outside"),
    (dict(obs=[[0, 0], [np.nan, 0], [0, 0], [0, 0]]), r"episodes\[0\]\.obs: contains NaN"),
    (dict(obs=[[0, 0, 0]] * 4), r"episodes\[0\]\.obs: expected shape \[T, 2\]"),
    (dict(obs=[0, 0, 0, 0]), r"episodes\[0\]\.obs: expected shape \[T, 2\]"),
    (dict(actions=[0, 1, 3]), r"episodes\[0\]\.actions: values must be integers in \[0, 3\)"),
    (dict(actions=[0, 1.5, 2]), r"episodes\[0\]\.actions: values must be integers"),
    (dict(actions=[0, -1, 2]), r"episodes\[0\]\.actions: values must be integers"),
    (dict(actions=[[0, 1], [1, 1], [2, 1]]), r"episodes\[0\]\.actions: expected a flat list"),
    (dict(rewards=[1.0, np.inf, 0.0]), r"episodes\[0\]\.rewards: contains NaN or Inf"),
    (dict(rewards=[1.0, np.nan, 0.0]), r"episodes\[0\]\.rewards: contains NaN or Inf"),
    (dict(logp=[-1.0, -1.0]), r"episodes\[0\]\.action_logp: expected shape \[3\], got \[2\]"),
    (dict(logp=[[-1.0]] * 3), r"episodes\[0\]\.action_logp: expected shape \[3\], got \[3, 1\]"),
    (dict(logp=[-1.0, np.nan, -1.0]), r"episodes\[0\]\.action_logp: contains NaN"),
    (dict(dist=np.zeros((3, 2))), r"action_dist_inputs: expected shape \[3, 3\], got \[3, 2\]"),
    (dict(dist=np.full((3, 3), np.inf)), r"action_dist_inputs: contains NaN or Inf"),
])
def test_validate_fragment_errors(kw, pattern):
    with pytest.raises(InvalidEpisode, match=pattern):
        validate(fragment(**kw))


def test_observation_size_limit():
    with pytest.raises(InvalidEpisode, match="max_obs_floats"):
        validate(fragment(), limits=Limits(max_episode_steps=50, max_obs_floats=1))


def test_box_actions_checked_against_bounds_and_shape():
    ok = fragment(2, actions=[[0.5, -0.5], [1.0, -1.0]])
    assert validate(ok, act_space=BOX_ACT).actions.shape == (2, 2)
    with pytest.raises(InvalidEpisode, match="actions: values outside"):
        validate(fragment(2, actions=[[0.5, -0.5], [1.5, 0.0]]), act_space=BOX_ACT)
    with pytest.raises(InvalidEpisode, match=r"actions: expected shape \[T, 2\]"):
        validate(fragment(2, actions=[0.5, 0.5]), act_space=BOX_ACT)


def test_single_element_box_accepts_flat_lists():
    obs_space, act_space = SpaceSpec.box([1], -1.0, 1.0), SpaceSpec.box([1], -2.0, 2.0)
    f = fragment(2, obs=[0.1, 0.2, 0.3], actions=[1.5, -2.0])
    out = validate(f, obs_space, act_space)
    assert out.obs.shape == (3, 1) and out.actions.shape == (2, 1)
    np.testing.assert_array_equal(out.obs[:, 0], [0.1, 0.2, 0.3])


def test_discrete_observations_and_column_actions():
    out = validate(fragment(2, obs=[0, 4, 1], actions=[[2], [0]]), SpaceSpec.discrete(5), ACT)
    assert out.obs.shape == (3,)
    with pytest.raises(InvalidEpisode, match=r"obs: values must be integers in \[0, 5\)"):
        validate(fragment(2, obs=[0, 5, 1]), SpaceSpec.discrete(5), ACT)


@pytest.mark.parametrize("act_space, layout", [
    (ACT, LAYOUT), (SpaceSpec.box([1], -1.0, 1.0), StepLayout.flat(2, 1, 2)),
    (BOX_ACT, StepLayout.flat(2, 2, 4))])
def test_zero_step_fragment_is_valid_and_becomes_one_final_record(act_space, layout):
    """obs = [o], no steps: e.g. a truncation noticed right after a cut. Valid RLlink."""
    f = fragment(0, obs=[[1.0, 2.0]], actions=[], rewards=[], truncated=True)
    out = validate(f, act_space=act_space, dist_size=layout.dist_size)
    rec = fragment_records(out, layout, stream_id=5, weights_seq_no=2)
    assert len(rec) == 1 and rec["flags"][0] == FINAL_OBS | TRUNCATED
    np.testing.assert_array_equal(rec["obs"]["obs"][0], [1.0, 2.0])


# ---------------------------------------------------------------- fragment_records
def test_fragment_records_layout():
    f = validate(fragment(3, terminated=True, logp=[-1.0, -0.5, -0.25],
                          dist=np.arange(9).reshape(3, 3)))
    rec = fragment_records(f, LAYOUT, stream_id=7, weights_seq_no=42)
    assert rec.dtype == LAYOUT.dtype and len(rec) == 4
    assert (rec["stream_id"] == 7).all() and (rec["weights_seq_no"] == 42).all()
    assert (rec["ingest_id"] == 0).all()
    np.testing.assert_array_equal(rec["obs"]["obs"], f.obs.astype(np.float32))
    np.testing.assert_array_equal(rec["reward"], [0.5, 1.0, 1.5, 0.0])
    np.testing.assert_array_equal(rec["action"][:, 0], [0, 1, 2, 0])
    np.testing.assert_array_equal(rec["logp"], np.float32([-1.0, -0.5, -0.25, 0.0]))
    np.testing.assert_array_equal(rec["dist"][:3], np.arange(9).reshape(3, 3))
    np.testing.assert_array_equal(rec["dist"][3], [0, 0, 0])
    assert list(rec["flags"]) == [HAS_LOGP | HAS_DIST] * 3 + [FINAL_OBS | TERMINATED]


@pytest.mark.parametrize("terminated, truncated, end", [
    (True, False, FINAL_OBS | TERMINATED), (False, True, FINAL_OBS | TRUNCATED),
    (False, False, FINAL_OBS)])
def test_fragment_records_end_flags_and_no_optional_columns(terminated, truncated, end):
    rec = fragment_records(validate(fragment(2, terminated=terminated, truncated=truncated)),
                           LAYOUT, stream_id=1, weights_seq_no=-1)
    assert list(rec["flags"]) == [0, 0, end]
    assert (rec["weights_seq_no"] == -1).all()
    assert (rec["logp"] == 0).all() and (rec["dist"] == 0).all()
    # FINAL_OBS only on the last record
    assert [(flags & FINAL_OBS) != 0 for flags in rec["flags"]] == [False, False, True]


def test_fragment_records_box_actions_flattened():
    layout = StepLayout.flat(2, 2, 4)
    f = validate(fragment(2, actions=[[0.5, -0.5], [1.0, -1.0]]), act_space=BOX_ACT, dist_size=4)
    rec = fragment_records(f, layout, 3, 0)
    np.testing.assert_array_equal(rec["action"][:2], [[0.5, -0.5], [1.0, -1.0]])
    np.testing.assert_array_equal(rec["action"][2], [0.0, 0.0])


# ---------------------------------------------------------------- EpisodeTracker
def test_cut_fragment_continued_by_repeating_first_obs_is_one_episode():
    tracker = EpisodeTracker()
    first = fragment(3, obs=[[0, 0], [1, 1], [2, 2], [3, 3]], rewards=[1.0, 2.0, 3.0])
    assert tracker.add(first) == []
    second = fragment(2, obs=[[3, 3], [4, 4], [5, 5]], rewards=[10.0, 20.0], terminated=True)
    assert tracker.add(second) == [(36.0, 5)]
    assert tracker.last_obs is None and tracker.open_length == 0


def test_three_fragment_episode_ending_truncated():
    tracker = EpisodeTracker()
    assert tracker.add(fragment(1, obs=[[0, 0], [1, 0]], rewards=[1.0])) == []
    assert tracker.add(fragment(1, obs=[[1, 0], [2, 0]], rewards=[1.0])) == []
    assert tracker.add(fragment(1, obs=[[2, 0], [3, 0]], rewards=[1.0], truncated=True)) == [(3.0, 3)]


def test_non_repeating_first_obs_starts_a_new_episode():
    tracker = EpisodeTracker()
    tracker.add(fragment(3, obs=[[0, 0], [1, 1], [2, 2], [3, 3]], rewards=[1.0, 2.0, 3.0]))
    other = fragment(2, obs=[[9, 9], [4, 4], [5, 5]], rewards=[10.0, 20.0], terminated=True)
    assert tracker.add(other) == [(30.0, 2)]


def test_fragment_after_a_finished_episode_starts_fresh_even_if_obs_repeats():
    tracker = EpisodeTracker()
    assert tracker.add(fragment(1, obs=[[0, 0], [1, 1]], rewards=[5.0], terminated=True)) == [(5.0, 1)]
    assert tracker.add(fragment(1, obs=[[1, 1], [2, 2]], rewards=[1.0], truncated=True)) == [(1.0, 1)]


def test_tracker_does_not_alias_the_fragment_array():
    tracker = EpisodeTracker()
    obs = np.array([[0.0, 0.0], [1.0, 1.0]])
    tracker.add(fragment(1, obs=obs, rewards=[1.0]))
    obs[-1] = 99.0  # the client's buffer is reused
    assert tracker.add(fragment(1, obs=[[1, 1], [2, 2]], rewards=[1.0], terminated=True)) == [(2.0, 2)]


# ---------------------------------------------------------------- EpisodeStats
def test_episode_stats_means():
    stats = EpisodeStats()
    assert stats.mean_return() is None and stats.mean_length() is None and stats.episodes == 0
    for ret, length in [(1.0, 10), (2.0, 20), (6.0, 30)]:
        stats.record(ret, length)
    assert stats.episodes == 3
    assert stats.mean_return() == pytest.approx(3.0)
    assert stats.mean_return(last=2) == pytest.approx(4.0)
    assert stats.mean_return(last=1) == pytest.approx(6.0)
    assert stats.mean_length() == pytest.approx(20.0)


def test_episode_stats_keep_the_last_100():
    stats = EpisodeStats()
    for i in range(150):
        stats.record(float(i), i)
    assert stats.episodes == 150 and len(stats.returns) == 100
    assert stats.mean_return() == pytest.approx(np.mean(np.arange(50, 150)))
    assert stats.mean_return(last=20) == pytest.approx(np.mean(np.arange(130, 150)))
    assert stats.mean_length() == pytest.approx(99.5)
