"""client_lib.protocol spaces, columns and masking: JSON / gymnasium round trips, limits,
validation naming the leaf, leaf columns, action vectors, action masks (tier 1, pure)."""
from __future__ import annotations

import math
import re
from collections import OrderedDict

import gymnasium as gym
import numpy as np
import orjson
import pytest
from hypothesis import given, settings, strategies as st

from rlinkd.client_lib.protocol.columns import (action_columns, action_vector, check_action_vector,
                                                native, one_action, to_columns, to_wire)
from rlinkd.client_lib.protocol.compact import encode_compact
from rlinkd.client_lib.protocol.masking import MASKED_LOGIT, check_actions, check_masks, mask_spec
from rlinkd.client_lib.protocol.spaces import (MAX_DEPTH, MAX_LEAVES, Box, Dict, Discrete, InvalidValue,
                                               MultiBinary, MultiDiscrete, SpaceError, Tuple,
                                               record_fields, space_from_gym, space_from_json)

INF = math.inf


def json_round_trip(space):
    """Through real JSON bytes (no Infinity tokens allowed) and back."""
    return space_from_json(orjson.loads(orjson.dumps(space.to_json())))


# ---------------------------------------------------------------- construction and JSON
def test_box_with_infinite_bounds_json_uses_null_and_round_trips():
    box = Box([4], low=[-4.8, -INF, -0.42, -INF], high=[4.8, INF, 0.42, INF])
    d = box.to_json()
    assert d == {"type": "Box", "shape": [4], "low": [-4.8, None, -0.42, None],
                 "high": [4.8, None, 0.42, None]}
    assert json_round_trip(box) == box


def test_box_defaults_scalars_and_nested_bounds():
    unbounded = Box((2, 3))
    assert unbounded.low == (-INF,) * 6 and unbounded.high == (INF,) * 6
    scalar = space_from_json({"type": "box", "shape": [2, 2], "low": -1, "high": 2.5})
    assert scalar.shape == (2, 2) and scalar.low == (-1.0,) * 4 and scalar.high == (2.5,) * 4
    nested = Box([2, 2], low=[[0, 1], [2, None]])
    assert nested.low == (0.0, 1.0, 2.0, -INF)
    assert json_round_trip(nested) == nested
    assert nested.size == 4 and nested.action_width == 4 and nested.dist_width == 8
    assert nested.is_float and not nested.is_image


@pytest.mark.parametrize("dtype, record, low, high", [
    ("uint8", "|u1", 0, 255), ("int8", "|i1", -128, 127), ("int32", "<i4", -2**31, 2**31 - 1),
    ("int64", "<i8", -2**63, 2**63 - 1), ("bool", "|b1", 0, 1), ("float64", "<f4", -INF, INF)])
def test_box_dtypes_default_bounds_storage_and_json(dtype, record, low, high):
    box = Box([3], dtype)
    assert box.record_dtype == np.dtype(record) and box.record_shape == (3,)
    assert box.low == (float(low),) * 3 and box.high == (float(high),) * 3
    assert box.to_json()["dtype"] == dtype
    assert json_round_trip(box) == box


def test_image_box_is_stored_as_uint8_and_has_one_number_bounds():
    image = Box([84, 84, 3], "uint8", 0, 255)
    assert image.is_image and not image.is_float
    assert image.to_json() == {"type": "Box", "shape": [84, 84, 3], "dtype": "uint8", "low": 0.0,
                               "high": 255.0}
    with pytest.raises(SpaceError, match="integer Box"):
        _ = image.action_width  # integer Box actions are unsupported (use MultiDiscrete)


def test_discrete_json_round_trip_start_and_sizes():
    d = Discrete(3)
    assert d.to_json() == {"type": "Discrete", "n": 3}
    assert space_from_json({"type": "Discrete", "n": 3}) == d
    assert d.action_width == 1 and d.dist_width == 3 and d.record_shape == () and d.record_dtype == np.int64
    shifted = Discrete(3, start=-1)
    assert shifted.to_json() == {"type": "Discrete", "n": 3, "start": -1}
    assert json_round_trip(shifted) == shifted and shifted != d


def test_multi_discrete_and_multi_binary_json_and_sizes():
    md = MultiDiscrete([3, 4], start=[1, -2])
    assert md.to_json() == {"type": "MultiDiscrete", "nvec": [3, 4], "start": [1, -2]}
    assert json_round_trip(md) == md
    assert md.record_shape == (2,) and md.action_width == 2 and md.dist_width == 7
    assert MultiDiscrete([3, 4]).to_json() == {"type": "MultiDiscrete", "nvec": [3, 4]}
    mb = MultiBinary(6)
    assert mb.to_json() == {"type": "MultiBinary", "n": 6} and json_round_trip(mb) == mb
    shaped = MultiBinary([2, 3])
    assert shaped.to_json() == {"type": "MultiBinary", "n": [2, 3]} and json_round_trip(shaped) == shaped
    assert shaped.n == 6 and shaped.record_shape == (2, 3) and shaped.record_dtype == np.int8
    assert shaped.action_width == 6 and shaped.dist_width == 6


NESTED = Dict({"camera": Box([4, 4, 3], "uint8", 0, 255),
               "arm": Dict({"joints": Box([2], low=-1.0, high=1.0), "gripper": MultiBinary(1)}),
               "mode": Discrete(3, start=1),
               "extra": Tuple([MultiDiscrete([2, 2]), Box([1])])})


def test_nested_dict_tuple_json_round_trip_keeps_declared_order_and_leaf_paths():
    assert list(NESTED.to_json()["spaces"]) == ["camera", "arm", "mode", "extra"]
    back = json_round_trip(NESTED)
    assert back == NESTED
    leaves = back.leaves()
    assert [leaf.key for leaf in leaves] == ["camera", "arm.joints", "arm.gripper", "mode",
                                             "extra.0", "extra.1"]
    assert leaves[4].path == ("extra", 0)
    assert leaves[4].display("obs") == 'obs["extra"][0]'
    assert record_fields(NESTED)[0] == ("camera", "|u1", (4, 4, 3))
    assert record_fields(Box([2])) == (("obs", "<f4", (2,)),)   # a root leaf's field is "obs"


def test_composite_action_and_dist_sizes_sum_over_leaves():
    act = Dict({"move": Box([2], low=-1.0, high=1.0), "fire": Discrete(3), "gear": MultiDiscrete([2, 4]),
                "lights": MultiBinary(2)})
    assert act.action_size == 2 + 1 + 2 + 2
    assert act.dist_size == 4 + 3 + 6 + 2


MALFORMED = [
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
    # the new families and keys
    {"type": "Box", "shape": [2], "dtype": "complex64"}, {"type": "Box", "shape": [2], "dtype": 5},
    {"type": "Box", "shape": [2], "dtype": "str"}, {"type": "Box", "shape": [2], "lo": 0},
    {"type": "Discrete", "n": 3, "start": 0.5}, {"type": "Discrete", "n": 3, "start": "1"},
    {"type": "MultiDiscrete"}, {"type": "MultiDiscrete", "nvec": []}, {"type": "MultiDiscrete", "nvec": [0]},
    {"type": "MultiDiscrete", "nvec": [2, 2], "start": [0]}, {"type": "MultiDiscrete", "nvec": 3},
    {"type": "MultiBinary"}, {"type": "MultiBinary", "n": 0}, {"type": "MultiBinary", "n": [2, -1]},
    {"type": "Dict"}, {"type": "Dict", "spaces": {}}, {"type": "Dict", "spaces": []},
    {"type": "Dict", "spaces": {"a b": {"type": "Discrete", "n": 2}}},
    {"type": "Dict", "spaces": {"k" * 65: {"type": "Discrete", "n": 2}}},
    {"type": "Dict", "spaces": {"a": 3}}, {"type": "Dict", "spaces": {"a": {"type": "Box"}}},
    {"type": "Tuple", "spaces": []}, {"type": "Tuple", "spaces": {"a": {"type": "Discrete", "n": 2}}},
    {"type": "Tuple", "spaces": [{"type": "Discrete", "n": 2}, "x"]},
    {"type": "Text", "max_length": 4}, {"type": 7},
]


@pytest.mark.parametrize("d", MALFORMED)
def test_malformed_space_descriptions_raise_space_error(d):
    with pytest.raises(SpaceError):
        space_from_json(d)


@pytest.mark.parametrize("d", [[1, 2], "Box", None, 3])
def test_from_json_refuses_non_objects(d):
    with pytest.raises(SpaceError):
        space_from_json(d)


# ---------------------------------------------------------------- limits
def nest(levels: int):
    space = Box([1])
    for i in range(levels):
        space = Dict({"a": space}) if i % 2 else Tuple([space])
    return space


def test_nesting_depth_limit():
    deep = nest(MAX_DEPTH)
    assert json_round_trip(deep) == deep
    with pytest.raises(SpaceError, match="deep"):
        nest(MAX_DEPTH + 1)
    with pytest.raises(SpaceError):
        space_from_json({"type": "Tuple", "spaces": [nest(MAX_DEPTH).to_json()]})


def test_absurdly_deep_json_is_a_space_error_not_a_crash():
    d: dict = {"type": "Box", "shape": [1]}
    for _ in range(5000):
        d = {"type": "Dict", "spaces": {"a": d}}
    with pytest.raises(SpaceError):
        space_from_json(d)


def test_leaf_count_limit():
    most = Dict({f"k{i}": Discrete(2) for i in range(MAX_LEAVES)})
    assert len(most.leaves()) == MAX_LEAVES
    with pytest.raises(SpaceError, match="leaves"):
        Dict({f"k{i}": Discrete(2) for i in range(MAX_LEAVES + 1)})
    with pytest.raises(SpaceError, match="leaves"):
        Tuple([most, Discrete(2)])


# ---------------------------------------------------------------- gymnasium
GYM_SPACES = [
    gym.spaces.Box(np.float32([-4.8, -np.inf, -0.41887903, -np.inf]),
                   np.float32([4.8, np.inf, 0.41887903, np.inf]), dtype=np.float32),
    gym.spaces.Box(0.0, 1.0, shape=(2, 3), dtype=np.float32),
    gym.spaces.Box(0, 255, shape=(8, 8, 3), dtype=np.uint8),
    gym.spaces.Box(-5, 5, shape=(2,), dtype=np.int32),
    gym.spaces.Box(0, 1, shape=(3,), dtype=bool),
    gym.spaces.Discrete(5), gym.spaces.Discrete(3, start=-1),
    gym.spaces.MultiDiscrete([3, 4]), gym.spaces.MultiDiscrete([3, 4], start=[1, -2]),
    gym.spaces.MultiBinary(5), gym.spaces.MultiBinary([2, 3]),
    gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Box(-1.0, 1.0, (2,), np.float32)]),
    gym.spaces.Dict({"camera": gym.spaces.Box(0, 255, (4, 4, 3), np.uint8),
                     "state": gym.spaces.Tuple([gym.spaces.MultiBinary(2), gym.spaces.Dict(
                         {"x": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
                          "k": gym.spaces.MultiDiscrete([2, 2], start=[1, 1])})])}),
]


@pytest.mark.parametrize("g", GYM_SPACES, ids=lambda g: type(g).__name__)
def test_gym_round_trips_through_json(g):
    space = space_from_gym(g)
    assert space.to_gym() == g
    back = json_round_trip(space)
    assert back == space and back.to_gym() == g


def test_gym_box_with_inf_bounds_is_float32_exact():
    g = GYM_SPACES[0]
    box = space_from_gym(g)
    assert box.shape == (4,) and box.low[1] == -INF and box.high[3] == INF
    np.testing.assert_array_equal(np.float32(box.low), g.low)
    np.testing.assert_array_equal(np.float32(box.high), g.high)


def test_gym_dict_keeps_key_order():
    g = gym.spaces.Dict(OrderedDict([("zeta", gym.spaces.Discrete(2)), ("alpha", gym.spaces.Discrete(3))]))
    assert list(g.spaces) == ["zeta", "alpha"]
    assert space_from_gym(g).keys() == ("zeta", "alpha")


def test_gym_unsupported_families_refused():
    with pytest.raises(SpaceError, match="unsupported"):
        space_from_gym(gym.spaces.Text(5))
    with pytest.raises(SpaceError, match="1-D"):
        space_from_gym(gym.spaces.MultiDiscrete([[2, 3], [4, 5]]))


# ---------------------------------------------------------------- leaf validation
DISCRETE = Discrete(3)
BOX = Box([2], low=[-1.0, 0.0], high=[1.0, 10.0])


def column(values, space, rows=None, prefix="episodes[0].actions"):
    """One leaf's values through to_columns (the path every transport takes)."""
    values = np.asarray(values) if not isinstance(values, list) else values
    return to_columns(values, space, len(values) if rows is None else rows, prefix)[""]


def test_discrete_accepts_valid_values_and_column_form():
    np.testing.assert_array_equal(column([0, 1, 2], DISCRETE), [0, 1, 2])
    assert column([], DISCRETE).shape == (0,)
    np.testing.assert_array_equal(column([[0.0], [2.0]], DISCRETE), [0, 2])  # [T, 1] accepted
    np.testing.assert_array_equal(column([-1, 1], Discrete(3, start=-1)), [-1, 1])


@pytest.mark.parametrize("values, pattern", [
    ([0.0, 3.0], r"integers in \[0, 3\)"),
    ([-1.0], r"integers in \[0, 3\)"),
    ([0.5], r"integers"),
    ([math.nan], "NaN or Inf"),
    ([math.inf], "NaN or Inf"),
    ([[0.0, 1.0]], r"shape \[2\], space wants \[\]"),
    (["a"], "values must be numbers"),
])
def test_discrete_errors(values, pattern):
    with pytest.raises(InvalidValue) as err:
        column(values, DISCRETE)
    assert str(err.value).startswith("episodes[0].actions") and re.search(pattern, str(err.value))


def test_box_accepts_in_bounds_and_tolerance():
    assert column([[-1.0, 0.0], [1.0, 10.0], [0.0, 5.0]], BOX).dtype == np.float32
    column([[1.0 + 5e-5, 10.0]], BOX)  # inside tolerance
    assert column(np.zeros((0, 2)), BOX).shape == (0, 2)


@pytest.mark.parametrize("values, pattern", [
    ([[1.01, 0.0]], "outside"),
    ([[0.0, -0.01]], "outside"),
    ([[0.0, 10.5]], "outside"),
    ([[math.nan, 0.0]], "NaN or Inf"),
    ([[0.0, math.inf]], "NaN or Inf"),
    ([[0.0, 1.0, 2.0]], r"shape \[3\], space wants \[2\]"),
    ([0.0, 1.0], r"shape \[\], space wants \[2\]"),
    (np.zeros((1, 2, 1)), r"shape \[2, 1\], space wants \[2\]"),
    ([[0.0, 1.0], [0.0]], r"\[1\]: shape \[1\], space wants \[2\]"),
    ([[1e300, 0.0]], "outside|float32"),
])
def test_box_errors(values, pattern):
    with pytest.raises(InvalidValue, match=pattern):
        column(values, BOX, prefix="obs")


def test_unbounded_box_refuses_only_non_finite():
    box = Box([1])
    column([[1e30], [-1e30]], box)
    with pytest.raises(InvalidValue, match="NaN"):
        column([[-math.inf]], box)
    with pytest.raises(InvalidValue, match="float32"):
        column([[1e300]], box)


@pytest.mark.parametrize("bound", [123456.7, 1e8 + 5, 0.3, -7.7, 33.3333])
def test_values_exactly_at_a_bound_are_accepted(bound):
    """A value equal to a declared bound is valid, whatever float32 does to the bound."""
    for box in (Box([1], low=bound), Box([1], high=bound), Box([1], low=bound, high=bound)):
        assert box.check(np.array([[bound]]), "o") is None
        assert box.check(np.float32([[bound]]), "o") is None


def test_values_clearly_beyond_a_large_bound_are_refused():
    assert Box([1], low=1e6).check(np.array([[1e6 - 1000.0]]), "o") is not None
    assert Box([1], high=1e6).check(np.array([[1e6 + 1000.0]]), "o") is not None


@pytest.mark.parametrize("space, good, bad, pattern", [
    (Box([2], "uint8", 0, 200), [[0, 200]], [[0, 201]], "outside"),
    (Box([2], "uint8"), [[0, 255]], [[0, 1.5]], "whole numbers"),
    (Box([2], "int32", -3, 3), [[-3, 3]], [[-4, 0]], "outside"),
    (Box([2], "bool"), [[0, 1]], [[0, 2]], "outside"),
    (MultiDiscrete([2, 3], start=[0, 1]), [[1, 3]], [[1, 0]], r"integers in \[start, start \+ nvec\)"),
    (MultiBinary(2), [[0, 1]], [[0, 2]], "0 or 1"),
])
def test_integer_leaves_check_bounds_and_keep_their_dtype(space, good, bad, pattern):
    assert column(good, space).dtype == space.record_dtype
    with pytest.raises(InvalidValue, match=pattern):
        column(bad, space)


# ---------------------------------------------------------------- composite values → columns
CAR = Dict({"camera": Box([84, 84, 3], "uint8", 0, 255), "speed": Box([1], low=0.0, high=50.0),
            "sensors": Tuple([Discrete(2), Dict({"x": Box([2], low=-1.0, high=1.0)})])})


def car_step(i: int = 0, camera=None, x=(0.5, -0.5)):
    return {"camera": np.full((84, 84, 3), i, np.uint8) if camera is None else camera,
            "speed": [float(i)], "sensors": [i % 2, {"x": list(x)}]}


def check_car(cols, rows):
    assert list(cols) == ["camera", "speed", "sensors.0", "sensors.1.x"]
    assert cols["camera"].dtype == np.uint8 and cols["camera"].shape == (rows, 84, 84, 3)
    assert cols["speed"].dtype == np.float32 and cols["speed"].shape == (rows, 1)
    assert cols["sensors.0"].dtype == np.int64 and cols["sensors.1.x"].shape == (rows, 2)
    np.testing.assert_array_equal(cols["camera"][:, 0, 0, 0], np.arange(rows))
    np.testing.assert_array_equal(cols["sensors.0"], np.arange(rows) % 2)


def test_per_step_form():
    check_car(to_columns([car_step(i) for i in range(3)], CAR, 3, "obs"), 3)
    # JSON-decoded nested lists (no ndarrays) are the same thing
    steps = orjson.loads(orjson.dumps([car_step(i) for i in range(2)], option=orjson.OPT_SERIALIZE_NUMPY))
    check_car(to_columns(steps, CAR, 2, "obs"), 2)


def test_columnar_dict_and_compact_forms():
    cameras = np.stack([np.full((84, 84, 3), i, np.uint8) for i in range(3)])
    columnar = {"camera": encode_compact(cameras), "speed": [[0.0], [1.0], [2.0]],
                "sensors": [[0, {"x": [0, 0]}], [1, {"x": [0, 0]}], [0, {"x": [0, 0]}]]}
    check_car(to_columns(columnar, CAR, 3, "obs"), 3)
    per_step_compact = dict(columnar, camera=[encode_compact(c) for c in cameras])
    check_car(to_columns(per_step_compact, CAR, 3, "obs"), 3)
    raw = dict(columnar, camera=cameras)  # native ndarray column
    check_car(to_columns(raw, CAR, 3, "obs"), 3)


def test_to_wire_round_trips_plain_and_compact():
    cols = to_columns([car_step(i) for i in range(2)], CAR, 2, "obs")
    for compact in (False, True):
        wire = orjson.loads(orjson.dumps(to_wire(cols, CAR, compact), option=orjson.OPT_SERIALIZE_NUMPY))
        back = to_columns(wire, CAR, 2, "obs")
        assert all(np.array_equal(back[k], cols[k]) and back[k].dtype == cols[k].dtype for k in cols)
    assert isinstance(to_wire(cols, CAR, False), list)
    assert "b64" in to_wire(cols, CAR, True)["camera"]
    step = native(cols, CAR, 1)
    assert step["camera"].shape == (84, 84, 3) and step["sensors"][0] == 1 and isinstance(step["sensors"], tuple)


def compact_camera(rows, **override):
    return {**encode_compact(np.zeros((rows, 84, 84, 3), np.uint8)), **override}


@pytest.mark.parametrize("value, pattern", [
    ([car_step(0, camera=np.zeros((64, 64, 3), np.uint8))] * 2,
     re.escape('obs["camera"]: shape [64, 64, 3], space wants [84, 84, 3]')),
    ([car_step(0), {**car_step(1), "extra": 1}], r"obs: keys do not match the Dict space .*unexpected \['extra'\]"),
    ([car_step(0), {"camera": np.zeros((84, 84, 3))}], r"obs: keys do not match .*missing \['sensors', 'speed'\]"),
    ([car_step(0), [1, 2, 3]], "obs: each step must be an object"),
    ([car_step(0)], r"obs: 1 steps, expected 2"),
    ({"camera": [], "speed": []}, "obs: keys do not match"),
    ([car_step(0), {**car_step(1), "sensors": [1]}], re.escape('obs["sensors"]: each step must be a list of 2')),
    ([car_step(0), {**car_step(1), "speed": ["fast"]}], re.escape('obs["speed"]: values must be numbers')),
    ([car_step(0), {**car_step(1), "speed": [math.nan]}], re.escape('obs["speed"]: contains NaN')),
    ([car_step(0), {**car_step(1), "speed": [51.0]}], re.escape('obs["speed"]: values outside')),
    ([car_step(0), {**car_step(1), "sensors": [2, {"x": [0, 0]}]}],
     re.escape('obs["sensors"][0]: values must be integers in [0, 2)')),
    ([car_step(0), car_step(1, x=(0.0, 0.0, 0.0))], re.escape('obs["sensors"][1]["x"][1]: shape [3], space wants [2]')),
    ([car_step(0), car_step(1, x=(0.0, math.nan))], re.escape('obs["sensors"][1]["x"]: contains NaN')),
    ([car_step(0), car_step(1, camera=np.full((84, 84, 3), 256))], re.escape('obs["camera"]: values outside')),
])
def test_structure_dtype_shape_and_bound_errors_name_the_leaf(value, pattern):
    with pytest.raises(InvalidValue, match=pattern):
        to_columns(value, CAR, 2, "obs")


@pytest.mark.parametrize("camera, pattern", [
    (compact_camera(2, b64=encode_compact(np.zeros((2, 84, 84, 2), np.uint8))["b64"]),
     r'obs\["camera"\]: \d+ bytes, but uint8 x \[2, 84, 84, 3\] needs \d+'),
    (compact_camera(2, dtype="complex64"), r'obs\["camera"\]: unknown compact dtype'),
    (compact_camera(2, b64="***"), "not valid base64"),
    (compact_camera(2, shape=[2, -84, 84, 3]), "shape must be"),
    ({**compact_camera(2), "order": "F"}, "exactly the keys"),
    (compact_camera(3, shape=[3, 84, 84, 3]), r'obs\["camera"\]: 3 steps, expected 2'),
    ([encode_compact(np.zeros((84, 84, 3), np.uint8)), np.zeros((84, 84, 3)).tolist()],
     "mixes compact arrays and plain lists"),
])
def test_bad_compact_arrays_refused(camera, pattern):
    value = {"camera": camera, "speed": [[0.0]] * 2, "sensors": [[0, {"x": [0, 0]}]] * 2}
    with pytest.raises(InvalidValue, match=pattern):
        to_columns(value, CAR, 2, "obs")


# ---------------------------------------------------------------- action vectors
ACT = Dict({"move": Box([2], low=-1.0, high=1.0), "fire": Discrete(3, start=1),
            "gear": MultiDiscrete([2, 4], start=[0, -1]), "lights": MultiBinary(2)})


def test_action_vector_round_trip_uses_zero_based_indices():
    steps = [{"move": [0.5, -1.0], "fire": 3, "gear": [1, -1], "lights": [1, 0]},
             {"move": [0.0, 1.0], "fire": 1, "gear": [0, 2], "lights": [0, 0]}]
    cols = to_columns(steps, ACT, 2, "actions")
    vec = action_vector(cols, ACT)
    assert vec.dtype == np.float32 and vec.shape == (2, ACT.action_size)
    np.testing.assert_array_equal(vec, [[0.5, -1.0, 2, 1, 0, 1, 0], [0.0, 1.0, 0, 0, 3, 0, 0]])
    assert check_action_vector(vec, ACT, "a") is None
    back = action_columns(vec, ACT)
    assert all(np.array_equal(back[k], cols[k]) and back[k].dtype == cols[k].dtype for k in cols)


def test_root_leaf_action_vectors():
    vec = action_vector({"": np.array([0, 2])}, Discrete(3))
    np.testing.assert_array_equal(vec, [[0], [2]])
    np.testing.assert_array_equal(action_columns(vec, Discrete(3))[""], [0, 2])
    box = Box([2], low=-1.0, high=1.0)
    np.testing.assert_array_equal(action_columns(np.float32([[2.0, -0.5]]), box)[""], [[1.0, -0.5]])  # clipped


@pytest.mark.parametrize("row, pattern", [
    ([0, 0, 3, 0, 0, 0, 0], r'a\["fire"\]: values must be integers in \[0, 3\)'),
    ([0, 0, 0.5, 0, 0, 0, 0], r'a\["fire"\]: values must be integers'),
    ([0, 0, 0, 2, 0, 0, 0], r'a\["gear"\]'),
    ([0, 0, 0, 0, 0, 1, 2], r'a\["lights"\]: MultiBinary'),
    ([2, 0, 0, 0, 0, 0, 0], r'a\["move"\]: values outside'),
])
def test_check_action_vector_names_the_leaf(row, pattern):
    error = check_action_vector(np.float32([row]), ACT, "a")
    assert error is not None and re.search(pattern, error), error


# ---------------------------------------------------------------- action masks
MASK_ACT = Dict({"move": Box([2], low=-1.0, high=1.0), "fire": Discrete(3), "gear": MultiDiscrete([2, 2])})


def masked_obs(m: int = 7):
    return Dict({"state": Box([3]), "action_mask": MultiBinary(m)})


def test_mask_spec_layout():
    assert mask_spec(masked_obs(), MASK_ACT, "") is None
    spec = mask_spec(masked_obs(), MASK_ACT, "action_mask")
    assert spec.key == "action_mask" and spec.size == 7
    # dist inputs: move 4 (means, log-stds), fire 3 logits, gear 2 + 2 logits
    assert spec.dist_positions == (4, 5, 6, 7, 8, 9, 10)
    # (action-vector index, first mask entry, choices) per categorical component
    assert spec.components == ((2, 0, 3), (3, 3, 2), (4, 5, 2))
    assert MASKED_LOGIT == -1e9 and np.float32(MASKED_LOGIT) == np.float32(-1e9)


@pytest.mark.parametrize("obs, act, pattern", [
    (Box([7]), MASK_ACT, "must be a Dict"),
    (Dict({"state": Box([3])}), MASK_ACT, "must be a Dict with that key"),
    (masked_obs(6), MASK_ACT, r"must be MultiBinary\(7\)"),
    (Dict({"action_mask": Box([7])}), MASK_ACT, r"must be MultiBinary\(7\)"),
    (masked_obs(2), Box([2]), "no Discrete or MultiDiscrete"),
])
def test_mask_spec_refuses_unusable_masks(obs, act, pattern):
    with pytest.raises(SpaceError, match=pattern):
        mask_spec(obs, act, "action_mask")


def test_check_masks_and_actions():
    spec = mask_spec(masked_obs(), MASK_ACT, "action_mask")
    masks = np.int8([[1, 0, 1, 0, 1, 1, 1], [0, 1, 0, 1, 0, 0, 1]])
    assert check_masks(masks, spec, "m") is None
    actions = np.float32([[0.3, 0.1, 2, 1, 1], [0.0, 0.0, 1, 0, 1]])
    assert check_actions(masks, actions, spec, "a") is None
    assert check_actions(masks[:0], actions[:0], spec, "a") is None
    bad = actions.copy()
    bad[1, 3] = 1  # gear component 0 takes choice 1, masked in step 1
    assert check_actions(masks, bad, spec, "a") == ("a: step 1 takes choice 1 of discrete action "
                                                    "component 1, which its action mask forbids")
    empty = masks.copy()
    empty[0, 5:7] = 0  # gear component 1 has no legal choice
    assert check_masks(empty, spec, "m") == "m: a step allows no choice for discrete action component 2"


# ---------------------------------------------------------------- one small Box, the fast check

_EDGE_FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64),
                         st.sampled_from([4.8, -4.8, 4.8 * (1 + 1e-4), 4.80049, 0.418, -0.41805, 3.5e38,
                                          -3.5e38, float(np.finfo(np.float32).max), 1e-45, 0.0]))
_EDGE_INTS = st.one_of(st.integers(-10**40, 10**40),  # (2**62 + 2**38 + 1 rounds differently to
                       st.sampled_from([2**62 + 2**38 + 1, -(2**62 + 2**38 + 1), 2**53, 2**53 + 1,  # float32
                                        2**63 - 1, 2**64 - 1, -2**63]))                 # through a double)


def _general_path(value, space):
    """to_columns without the one-small-Box fast path (a one-row leaf through _collect)."""
    from rlinkd.client_lib.protocol import columns as C
    out = {}
    C._collect([value], space, (), 1, "obs", out)
    return out


@settings(max_examples=400, deadline=None)
@given(values=st.lists(st.one_of(_EDGE_FLOATS, _EDGE_INTS), min_size=4, max_size=4),
       dtype=st.sampled_from([np.float32, np.float64, list]), bounded=st.booleans())
def test_one_small_box_fast_check_agrees_with_the_general_path(values, dtype, bounded):
    """ndarrays (client-side agents) and lists of JSON numbers (serving requests) alike."""
    space = (Box((4,), low=[-4.8, -math.inf, -0.418, -math.inf], high=[4.8, math.inf, 0.418, math.inf])
             if bounded else Box((2, 2)))
    if dtype is list:
        value = values if bounded else [values[:2], values[2:]]
    else:
        with np.errstate(over="ignore"):
            value = np.array([float(v) for v in values], dtype).reshape(space.shape)
    try:
        expected = _general_path(value, space)
    except InvalidValue:
        expected = None
    try:
        got = to_columns([value], space, 1, "obs")
    except InvalidValue:
        got = None
    assert (got is None) == (expected is None), values
    if got is not None:
        assert got.keys() == expected.keys() == {""}
        assert got[""].dtype == expected[""].dtype == np.float32 and got[""].shape == (1, *space.shape)
        assert np.array_equal(got[""], expected[""])


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.one_of(st.lists(st.one_of(_EDGE_FLOATS, _EDGE_INTS), min_size=4, max_size=4),
                               st.lists(st.floats(-4, 4), min_size=3, max_size=5), st.just("x")),
                     min_size=2, max_size=5))
def test_few_small_boxes_fast_check_agrees_with_the_general_path(rows):
    """Several serving steps at once (a STEP_BATCH's entries): row by row, the same verdict
    and the same array as the general path."""
    space = Box((4,), low=[-4.8, -math.inf, -0.418, -math.inf], high=[4.8, math.inf, 0.418, math.inf])
    try:
        expected: dict | None = {}
        _collect_rows(rows, space, expected)
    except InvalidValue:
        expected = None
    try:
        got = to_columns(rows, space, len(rows), "obs")
    except InvalidValue:
        got = None
    assert (got is None) == (expected is None), rows
    if got is not None:
        assert got[""].dtype == np.float32 and got[""].shape == (len(rows), 4)
        assert np.array_equal(got[""], expected[""])


def test_one_small_box_fast_path_copies_and_leaves_other_forms_to_the_general_path():
    space = Box((3,), low=-1.0, high=1.0)
    obs = np.array([0.1, 0.2, 0.3], np.float32)
    cols = to_columns([obs], space, 1, "obs")
    obs[0] = 0.9  # a simulator reusing its buffer must not change what was recorded
    assert cols[""][0, 0] == np.float32(0.1)
    for bad in (np.array([0.1, 2.0, 0.3]), np.array([0.1, np.nan, 0.3]), np.zeros(4), np.zeros((1, 3))):
        with pytest.raises(InvalidValue):
            to_columns([bad], space, 1, "obs")
    assert to_columns([[0.1, 0.2, 0.3]], space, 1, "obs")[""].shape == (1, 3)  # a list of numbers
    for bad in ([0.1, 2.0, 0.3], [0.1, "0.2", 0.3], [0.1, 0.2], [[0.1], [0.2], [0.3]]):
        with pytest.raises(InvalidValue):
            to_columns([bad], space, 1, "obs")
    assert Box((17,)).small_float_bounds is None and Box((2,), "int32").small_float_bounds is None


@pytest.mark.parametrize("big", [2**62 + 2**38 + 1, -(2**62 + 2**38 + 1), 2**53 + 1, 2**64 - 1])
def test_a_large_integer_rounds_to_float32_once_as_in_the_general_path(big):
    """(Through a double first, 2**62 + 2**38 + 1 would round to another float32.)"""
    space = Box((4,), low=[-4.8, -math.inf, -0.418, -math.inf], high=[4.8, math.inf, 0.418, math.inf])
    one, rows = [0, big, 0, 1], [[0, big, 0, 1], [0, 1, 0, big]]  # (all integers: numpy takes int64)
    assert np.array_equal(to_columns([one], space, 1, "obs")[""], _general_path(one, space)[""])
    expected: dict = {}
    _collect_rows(rows, space, expected)
    assert np.array_equal(to_columns(rows, space, 2, "obs")[""], expected[""])


def _collect_rows(rows, space, out) -> None:
    from rlinkd.client_lib.protocol import columns as C
    C._collect(rows, space, (), len(rows), "obs", out)


@pytest.mark.parametrize("big", [-2**63 - 1, 2**64, 10**30])
def test_integers_numpy_cannot_hold_are_refused_on_the_fast_path_too(big):
    space = Box((4,), low=[-4.8, -math.inf, -0.418, -math.inf], high=[4.8, math.inf, 0.418, math.inf])
    with pytest.raises(InvalidValue, match="numbers"):
        to_columns([[0.0, 0.0, 0.0, big]], space, 1, "obs")
    assert to_columns([[0.0, 0.0, 0.0, 2**64 - 1]], space, 1, "obs")[""].shape == (1, 4)


@pytest.mark.parametrize("space", [
    Discrete(3, start=-1), Discrete(5), Box([2], low=-1.0, high=1.0), MultiDiscrete([3, 4], start=[1, -2]),
    Dict({"move": Box([2], low=-1.0, high=1.0), "fire": Discrete(3), "gear": MultiDiscrete([2, 4])})])
def test_one_answered_action_decodes_as_the_general_path_does(space):
    rng = np.random.default_rng(0)
    for _ in range(20):
        vec = rng.integers(-2, 5, size=space.action_size).astype(np.float32) + rng.choice([0.0, 0.5, 0.49])
        want = native(action_columns(vec[None], space), space, 0)
        got = one_action(vec, space)
        if isinstance(want, dict):
            assert want.keys() == got.keys() and all(np.array_equal(want[k], got[k]) for k in want)
        else:
            assert np.array_equal(want, got) and type(got) is type(want)
