"""Box.check's bound test (reduced per element over the steps before comparing, for speed):
it must still catch one value out of its own element's bounds, in any step."""
from __future__ import annotations

import numpy as np

from rlinkd.client_lib.protocol.spaces import Box


def test_one_image_value_above_a_per_element_bound_is_refused_in_any_step():
    high = np.full((4, 4, 3), 255)
    high[2, 1, 0] = 100
    box = Box((4, 4, 3), "uint8", 0, high.tolist())
    values = np.full((5, 4, 4, 3), 100, np.uint8)
    assert box.check(values, "obs") is None
    values[3, 2, 1, 0] = 101          # above its own element's bound, below every other's
    assert box.check(values, "obs") == "obs: values outside the declared Box bounds"


def test_float_values_below_a_per_element_low_bound_are_refused():
    box = Box((2,), "float32", [-1.0, 0.0], [1.0, 1.0])
    assert box.check(np.array([[-1.0, 0.0], [0.5, 0.5]], np.float32), "x") is None
    assert box.check(np.array([[-0.5, 0.5], [-0.5, -0.5]], np.float32), "x") is not None


def test_values_of_a_dtype_the_bounds_cover_are_not_compared_but_wider_dtypes_are():
    box = Box((2, 2, 1), "uint8", 0, 255)
    assert box.check(np.full((3, 2, 2, 1), 255, np.uint8), "img") is None
    assert box.check(np.full((3, 2, 2, 1), 256, np.int64), "img") is not None  # JSON ints arrive as int64
    narrow = Box((2, 2, 1), "uint8", 0, 254)
    assert narrow.check(np.full((3, 2, 2, 1), 255, np.uint8), "img") is not None
    flags = Box((2,), "bool")
    assert flags.check(np.ones((2, 2), bool), "b") is None
