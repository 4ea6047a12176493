"""client_lib.protocol.spaces: JSON / gymnasium round trips, validation and features (tier 1, pure)."""
from __future__ import annotations

import math
import re

import gymnasium as gym
import numpy as np
import orjson
import pytest

from rlinkd.client_lib.protocol.spaces import (SpaceError, SpaceSpec, check_box, check_discrete, check_values,
                               to_features)

INF = math.inf


# ---------------------------------------------------------------- construction and JSON
def test_box_with_infinite_bounds_json_uses_null_and_round_trips():
    spec = SpaceSpec.box([4], [-4.8, -INF, -0.42, -INF], [4.8, INF, 0.42, INF])
    d = spec.to_json()
    assert d == {"type": "Box", "shape": [4], "low": [-4.8, None, -0.42, None],
                 "high": [4.8, None, 0.42, None]}
    # the JSON form survives real JSON (no Infinity tokens) and reads back equal
    assert SpaceSpec.from_json(orjson.loads(orjson.dumps(d))) == spec


def test_box_defaults_scalars_and_nested_bounds():
    unbounded = SpaceSpec.box((2, 3))
    assert unbounded.low == (-INF,) * 6 and unbounded.high == (INF,) * 6
    scalar = SpaceSpec.from_json({"type": "box", "shape": [2, 2], "low": -1, "high": 2.5})
    assert scalar.shape == (2, 2) and scalar.low == (-1.0,) * 4 and scalar.high == (2.5,) * 4
    nested = SpaceSpec.box([2, 2], [[0, 1], [2, None]], None)
    assert nested.low == (0.0, 1.0, 2.0, -INF)
    assert SpaceSpec.from_json(nested.to_json()) == nested
    assert nested.flat_size == 4 and nested.feature_size == 4 and not nested.is_discrete


def test_discrete_json_round_trip_and_sizes():
    spec = SpaceSpec.discrete(3)
    assert spec.to_json() == {"type": "Discrete", "n": 3}
    assert SpaceSpec.from_json({"type": "Discrete", "n": 3}) == spec
    assert spec.is_discrete and spec.flat_size == 1 and spec.feature_size == 3


@pytest.mark.parametrize("d", [
    {"type": "Discrete", "n": 0}, {"type": "Discrete", "n": -2}, {"type": "Discrete", "n": 2.0},
    {"type": "Discrete", "n": True}, {"type": "Discrete"},
    {"type": "Box"}, {"type": "Box", "shape": []}, {"type": "Box", "shape": [0]},
    {"type": "Box", "shape": [2], "low": [0, 0, 0]}, {"type": "Box", "shape": [2], "high": [1]},
    {"type": "Box", "shape": [1], "low": 2, "high": 1}, {"type": "Box", "shape": [2], "low": "x"},
    {"type": "Box", "shape": [2], "high": {}}, {"type": "Tuple"}, {},
    # malformed input must still be a SpaceError (config and clients catch only that)
    {"type": "Box", "shape": 4}, {"type": "Box", "shape": "ab"}, {"type": "Box", "shape": [2.5]},
    {"type": "Box", "shape": [True]}, {"type": "Box", "shape": [2], "low": ["a", "b"]},
    {"type": "Box", "shape": [1], "low": math.nan}, {"type": "Box", "shape": [2], "high": [1, math.nan]},
])
def test_malformed_space_descriptions_raise_space_error(d):
    with pytest.raises(SpaceError):
        SpaceSpec.from_json(d)


def test_from_json_refuses_non_dict():
    with pytest.raises(SpaceError):
        SpaceSpec.from_json([1, 2])  # type: ignore[arg-type]


# ---------------------------------------------------------------- gymnasium
def test_gym_box_with_inf_bounds():
    low = np.array([-4.8, -np.inf, -0.41887903, -np.inf], np.float32)
    space = gym.spaces.Box(low, -low, dtype=np.float32)
    spec = SpaceSpec.from_gym(space)
    assert spec.shape == (4,) and spec.low[1] == -INF and spec.high[3] == INF
    np.testing.assert_array_equal(np.float32(spec.low), space.low)  # float32-exact bounds
    np.testing.assert_array_equal(np.float32(spec.high), space.high)


def test_gym_box_multi_dimensional():
    space = gym.spaces.Box(0.0, 1.0, shape=(2, 3), dtype=np.float32)
    spec = SpaceSpec.from_gym(space)
    assert spec.shape == (2, 3) and spec.low == (0.0,) * 6 and spec.high == (1.0,) * 6


def test_gym_discrete_and_start_refused():
    spec = SpaceSpec.from_gym(gym.spaces.Discrete(5))
    assert spec == SpaceSpec.discrete(5)
    with pytest.raises(SpaceError, match="start"):
        SpaceSpec.from_gym(gym.spaces.Discrete(3, start=1))
    with pytest.raises(SpaceError, match="unsupported"):
        SpaceSpec.from_gym(gym.spaces.MultiBinary(3))


# ---------------------------------------------------------------- validation
DISCRETE = SpaceSpec.discrete(3)
BOX = SpaceSpec.box([2], [-1.0, 0.0], [1.0, 10.0])


def test_check_discrete_accepts_valid_indices():
    assert check_discrete(np.array([0.0, 1.0, 2.0]), 3, "a") is None
    assert check_discrete(np.array([]), 3, "a") is None
    assert check_values(np.array([[0.0], [2.0]]), DISCRETE, "a") is None  # [T, 1] accepted


@pytest.mark.parametrize("values, pattern", [
    (np.array([0.0, 3.0]), r"integers in \[0, 3\)"),
    (np.array([-1.0]), r"integers in \[0, 3\)"),
    (np.array([0.5]), r"integers in \[0, 3\)"),
    (np.array([np.nan]), "NaN or Inf"),
    (np.array([np.inf]), "NaN or Inf"),
    (np.array([[0.0, 1.0]]), "flat list"),
])
def test_check_discrete_errors(values, pattern):
    error = check_values(values, DISCRETE, "episodes[0].actions")
    assert error is not None and error.startswith("episodes[0].actions")
    assert re.search(pattern, error), error


def test_check_box_accepts_in_bounds_and_tolerance():
    assert check_values(np.array([[-1.0, 0.0], [1.0, 10.0], [0.0, 5.0]]), BOX, "o") is None
    assert check_values(np.array([[1.0 + 5e-5, 10.0]]), BOX, "o") is None  # inside tolerance
    assert check_values(np.zeros((0, 2)), BOX, "o") is None


@pytest.mark.parametrize("values, pattern", [
    (np.array([[1.01, 0.0]]), "outside"),
    (np.array([[0.0, -0.01]]), "outside"),
    (np.array([[0.0, 10.5]]), "outside"),
    (np.array([[np.nan, 0.0]]), "NaN or Inf"),
    (np.array([[0.0, np.inf]]), "NaN or Inf"),
    (np.array([[0.0, 1.0, 2.0]]), r"expected shape \[T, 2\]"),
    (np.array([0.0, 1.0]), r"expected shape \[T, 2\]"),
    (np.zeros((1, 2, 1)), r"expected shape \[T, 2\]"),
])
def test_check_box_errors(values, pattern):
    error = check_box(values, BOX, "obs")
    assert error is not None and re.search(pattern, error), error


def test_check_box_unbounded_refuses_only_non_finite():
    spec = SpaceSpec.box([1])
    assert check_values(np.array([[1e30], [-1e30]]), spec, "o") is None
    assert "NaN" in check_values(np.array([[-np.inf]]), spec, "o")


@pytest.mark.parametrize("bound", [123456.7, 1e8 + 5, 0.3, -7.7, 33.3333])
def test_values_exactly_at_a_bound_are_accepted(bound):
    """A value equal to a declared bound is valid, whatever float32 does to the bound."""
    assert check_values(np.array([[bound]]), SpaceSpec.box([1], bound, None), "o") is None
    assert check_values(np.array([[bound]]), SpaceSpec.box([1], None, bound), "o") is None
    assert check_values(np.array([[bound]]), SpaceSpec.box([1], bound, bound), "o") is None


def test_values_clearly_beyond_a_large_bound_are_refused():
    spec = SpaceSpec.box([1], 1e6, None)
    assert check_values(np.array([[1e6 - 1000.0]]), spec, "o") is not None
    spec = SpaceSpec.box([1], None, 1e6)
    assert check_values(np.array([[1e6 + 1000.0]]), spec, "o") is not None


# ---------------------------------------------------------------- features
def test_to_features_one_hot_for_discrete():
    out = to_features(np.array([2.0, 0.0, 1.0]), DISCRETE)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [[0, 0, 1], [1, 0, 0], [0, 1, 0]])
    np.testing.assert_array_equal(to_features(np.array([[1.0], [2.0]]), DISCRETE),
                                  [[0, 1, 0], [0, 0, 1]])


def test_to_features_flattens_box():
    spec = SpaceSpec.box([2, 2])
    values = np.arange(12, dtype=np.float64).reshape(3, 2, 2)
    out = to_features(values, spec)
    assert out.dtype == np.float32 and out.shape == (3, 4) and out.flags.c_contiguous
    np.testing.assert_array_equal(out, values.reshape(3, 4))


def test_to_features_of_no_rows():
    assert to_features(np.zeros((0, 2, 2)), SpaceSpec.box([2, 2])).shape == (0, 4)
    assert to_features(np.zeros(0), DISCRETE).shape == (0, 3)
