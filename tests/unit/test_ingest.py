"""Fragment validation and episode continuation (daemon.collector.ingest), step records (protocol.records)."""
from __future__ import annotations

import numpy as np
import pytest

from rlinkd.client_lib.protocol.codec import BadMessage, EpisodeFragment
from rlinkd.client_lib.protocol.records import fragment_records
from rlinkd.client_lib.protocol.masking import mask_spec
from rlinkd.client_lib.protocol.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, record_fields
from rlinkd.daemon.collector.ingest import (EpisodeStats, EpisodeTracker, InvalidEpisode, Limits,
                                            Spaces, validate_fragment)
from rlinkd.shm.records import FINAL_OBS, HAS_DIST, HAS_LOGP, TERMINATED, TRUNCATED, StepLayout

OBS = Box([2], low=-10.0, high=10.0)
ACT = Discrete(3)
BOX_ACT = Box([2], low=-1.0, high=1.0)
DIST = 3
LIMITS = Limits(max_episode_steps=50, max_obs_floats=100)
LAYOUT = StepLayout.flat(2, 1, DIST)


def fragment(t: int = 3, *, obs=None, actions=None, rewards=None, terminated=False,
             truncated=False, logp=None, dist=None) -> EpisodeFragment:
    """A fragment as the codec hands it over: obs and actions are the JSON values (lists)."""
    obs = np.arange((t + 1) * 2, dtype=np.float64).reshape(t + 1, 2) / 4 if obs is None else obs
    return EpisodeFragment(
        obs=np.asarray(obs).tolist(),
        actions=np.asarray(np.arange(t) % 3 if actions is None else actions).tolist(),
        rewards=np.asarray(np.arange(1, t + 1) / 2 if rewards is None else rewards, np.float64),
        is_terminated=terminated, is_truncated=truncated,
        action_logp=None if logp is None else np.asarray(logp, np.float64),
        action_dist_inputs=None if dist is None else np.asarray(dist, np.float64))


def validate(frag, obs_space=OBS, act_space=ACT, dist_size=DIST, limits=LIMITS, mask_key=""):
    spaces = Spaces(obs_space, act_space, dist_size, mask_spec(obs_space, act_space, mask_key))
    return validate_fragment(frag, spaces, limits, "episodes[0]")


# ---------------------------------------------------------------- validate_fragment
def test_valid_fragment_passes_unchanged():
    f = fragment(3, logp=[-1.0, -0.5, -0.1], dist=np.zeros((3, DIST)))
    out = validate(f)
    assert list(out.obs) == [""] and out.obs[""].dtype == np.float32
    np.testing.assert_array_equal(out.obs[""], np.float32(f.obs))
    assert out.actions.dtype == np.float32 and out.actions.shape == (3, 1)
    np.testing.assert_array_equal(out.actions[:, 0], f.actions)
    np.testing.assert_array_equal(out.action_logp, f.action_logp)
    assert out.is_terminated is False and out.is_truncated is False


def test_invalid_episode_is_a_bad_message():
    assert issubclass(InvalidEpisode, BadMessage)


@pytest.mark.parametrize("kw, pattern", [
    (dict(t=51), r"episodes\[0\]: 51 steps exceed max_episode_steps=50"),
    (dict(obs=[[0, 0], [11, 0], [0, 0], [0, 0]]), r"episodes\[0\]\.obs: values outside"),
    (dict(obs=[[0, 0], [np.nan, 0], [0, 0], [0, 0]]), r"episodes\[0\]\.obs: contains NaN"),
    (dict(obs=[[0, 0, 0]] * 4), r"episodes\[0\]\.obs: shape \[3\], space wants \[2\]"),
    (dict(obs=[0, 0, 0, 0]), r"episodes\[0\]\.obs: shape \[\], space wants \[2\]"),
    (dict(obs=[[0, 0], [0, 0], [0, 0]]), r"episodes\[0\]\.obs: 3 steps, expected 4"),
    (dict(obs=[[0, 0], ["a", 0], [0, 0], [0, 0]]), r"episodes\[0\]\.obs: values must be numbers"),
    (dict(actions=[0, 1, 3]), r"episodes\[0\]\.actions: values must be integers in \[0, 3\)"),
    (dict(actions=[0, 1.5, 2]), r"episodes\[0\]\.actions: values must be integers"),
    (dict(actions=[0, -1, 2]), r"episodes\[0\]\.actions: values must be integers"),
    (dict(actions=[[0, 1], [1, 1], [2, 1]]), r"episodes\[0\]\.actions: shape \[2\], space wants \[\]"),
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
    with pytest.raises(InvalidEpisode, match=r"actions: shape \[\], space wants \[2\]"):
        validate(fragment(2, actions=[0.5, 0.5]), act_space=BOX_ACT)


def test_single_element_box_accepts_flat_lists():
    obs_space, act_space = Box([1], low=-1.0, high=1.0), Box([1], low=-2.0, high=2.0)
    f = fragment(2, obs=[0.1, 0.2, 0.3], actions=[1.5, -2.0])
    out = validate(f, obs_space, act_space)
    assert out.obs[""].shape == (3, 1) and out.actions.shape == (2, 1)
    np.testing.assert_array_equal(out.obs[""][:, 0], np.float32([0.1, 0.2, 0.3]))


def test_discrete_observations_and_column_actions():
    out = validate(fragment(2, obs=[0, 4, 1], actions=[[2], [0]]), Discrete(5), ACT)
    assert out.obs[""].shape == (3,) and out.obs[""].dtype == np.int64
    np.testing.assert_array_equal(out.actions[:, 0], [2, 0])
    with pytest.raises(InvalidEpisode, match=r"obs: values must be integers in \[0, 5\)"):
        validate(fragment(2, obs=[0, 5, 1]), Discrete(5), ACT)


def test_discrete_start_actions_become_zero_based_indices():
    out = validate(fragment(2, actions=[-1, 1]), act_space=Discrete(3, start=-1))
    np.testing.assert_array_equal(out.actions[:, 0], [0, 2])
    with pytest.raises(InvalidEpisode, match=r"actions: values must be integers in \[-1, 2\)"):
        validate(fragment(2, actions=[0, 2]), act_space=Discrete(3, start=-1))


# ---------------------------------------------------------------- composite spaces
CAR = Dict({"camera": Box([2, 2, 1], "uint8", 0, 255), "speed": Box([1], low=0.0, high=5.0),
            "action_mask": MultiBinary(5)})
CAR_ACT = Dict({"steer": Discrete(3), "gears": MultiDiscrete([2])})


def car_fragment(t=2, *, camera=None, speed=None, mask=None, actions=None):
    camera = [[[[9], [8]], [[7], [255]]]] * (t + 1) if camera is None else camera
    obs = {"camera": camera, "speed": [[1.0]] * (t + 1) if speed is None else speed,
           "action_mask": [[1, 1, 1, 1, 1]] * (t + 1) if mask is None else mask}
    actions = [{"steer": 2, "gears": [1]}] * t if actions is None else actions
    return EpisodeFragment(obs=obs, actions=actions, rewards=np.ones(t), is_terminated=False,
                           is_truncated=False)


def validate_car(frag, mask_key="action_mask"):
    return validate(frag, CAR, CAR_ACT, CAR_ACT.dist_size, mask_key=mask_key)


def test_dict_observation_and_action_fragment_becomes_leaf_columns():
    out = validate_car(car_fragment())
    assert list(out.obs) == ["camera", "speed", "action_mask"]
    assert out.obs["camera"].dtype == np.uint8 and out.obs["camera"].shape == (3, 2, 2, 1)
    assert out.obs["action_mask"].dtype == np.int8
    np.testing.assert_array_equal(out.actions, np.float32([[2, 1], [2, 1]]))
    rec = fragment_records(out, StepLayout(record_fields(CAR), 2, 5), 1, 0)
    np.testing.assert_array_equal(rec["obs"]["camera"], out.obs["camera"])


@pytest.mark.parametrize("kw, pattern", [
    (dict(camera=[[[[9, 9], [8, 8]], [[7, 7], [6, 6]]]] * 3),
     r'episodes\[0\]\.obs\["camera"\]: shape \[2, 2, 2\], space wants \[2, 2, 1\]'),
    (dict(camera=[[[[256], [0]], [[0], [0]]]] * 3), r'obs\["camera"\]: values outside'),
    (dict(speed=[[1.0], [np.nan], [1.0]]), r'obs\["speed"\]: contains NaN'),
    (dict(actions=[{"steer": 3, "gears": [1]}] * 2), r'actions\["steer"\]: values must be integers'),
    (dict(actions=[{"steer": 1}] * 2), r"actions: keys do not match the Dict space"),
    (dict(mask=[[1, 1, 0, 1, 1]] * 3), r"actions: step 0 takes choice 2 of discrete action "
                                        r"component 0, which its action mask forbids"),
    (dict(mask=[[1, 1, 1, 0, 0]] * 3), r'obs\["action_mask"\]: a step allows no choice'),
])
def test_composite_fragment_errors_name_the_leaf(kw, pattern):
    with pytest.raises(InvalidEpisode, match=pattern):
        validate_car(car_fragment(**kw))


def test_mask_of_the_last_observation_is_not_checked_and_no_key_means_no_masking():
    """The final observation has no action; without action_mask_key the leaf is plain data."""
    validate_car(car_fragment(mask=[[1, 1, 1, 1, 1]] * 2 + [[0, 0, 0, 0, 0]]))
    validate_car(car_fragment(mask=[[1, 1, 0, 1, 1]] * 3), mask_key="")


@pytest.mark.parametrize("act_space, layout", [
    (ACT, LAYOUT), (Box([1], low=-1.0, high=1.0), StepLayout.flat(2, 1, 2)),
    (BOX_ACT, StepLayout.flat(2, 2, 4))])
def test_zero_step_fragment_is_valid_and_becomes_one_final_record(act_space, layout):
    """obs = [o], no steps: e.g. a truncation noticed right after a cut. Valid RLlink."""
    f = fragment(0, obs=[[1.0, 2.0]], actions=[], rewards=[], truncated=True)
    out = validate(f, act_space=act_space, dist_size=layout.dist_size)
    rec = fragment_records(out, layout, stream_id=5, weights_seq_no=2)
    assert out.actions.shape == (0, act_space.action_size)
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
    np.testing.assert_array_equal(rec["obs"]["obs"], f.obs[""])
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
def tracked(t, **kw):
    """The tracker sees validated (canonical) fragments."""
    return validate(fragment(t, **kw))


def test_cut_fragment_continued_by_repeating_first_obs_is_one_episode():
    tracker = EpisodeTracker()
    first = tracked(3, obs=[[0, 0], [1, 1], [2, 2], [3, 3]], rewards=[1.0, 2.0, 3.0])
    assert tracker.add(first) == []
    second = tracked(2, obs=[[3, 3], [4, 4], [5, 5]], rewards=[10.0, 20.0], terminated=True)
    assert tracker.add(second) == [(36.0, 5)]
    assert tracker.last_obs is None and tracker.open_length == 0


def test_three_fragment_episode_ending_truncated():
    tracker = EpisodeTracker()
    assert tracker.add(tracked(1, obs=[[0, 0], [1, 0]], rewards=[1.0])) == []
    assert tracker.add(tracked(1, obs=[[1, 0], [2, 0]], rewards=[1.0])) == []
    assert tracker.add(tracked(1, obs=[[2, 0], [3, 0]], rewards=[1.0], truncated=True)) == [(3.0, 3)]


def test_non_repeating_first_obs_starts_a_new_episode():
    tracker = EpisodeTracker()
    tracker.add(tracked(3, obs=[[0, 0], [1, 1], [2, 2], [3, 3]], rewards=[1.0, 2.0, 3.0]))
    other = tracked(2, obs=[[9, 9], [4, 4], [5, 5]], rewards=[10.0, 20.0], terminated=True)
    assert tracker.add(other) == [(30.0, 2)]


def test_fragment_after_a_finished_episode_starts_fresh_even_if_obs_repeats():
    tracker = EpisodeTracker()
    assert tracker.add(tracked(1, obs=[[0, 0], [1, 1]], rewards=[5.0], terminated=True)) == [(5.0, 1)]
    assert tracker.add(tracked(1, obs=[[1, 1], [2, 2]], rewards=[1.0], truncated=True)) == [(1.0, 1)]


def test_tracker_does_not_alias_the_fragment_array():
    tracker = EpisodeTracker()
    first = tracked(1, obs=[[0.0, 0.0], [1.0, 1.0]], rewards=[1.0])
    tracker.add(first)
    first.obs[""][-1] = 99.0  # the fragment's columns are reused
    assert tracker.add(tracked(1, obs=[[1, 1], [2, 2]], rewards=[1.0], terminated=True)) == [(2.0, 2)]


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
