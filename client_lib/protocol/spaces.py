"""Observation and action spaces: one class per family, each the one place that knows its
JSON form, its gymnasium twin, how its values are stored and how they are validated.

Families (JSON forms; ``null`` bounds are infinite because JSON has no infinity)::

    {"type": "Box", "shape": [84, 84, 3], "dtype": "uint8", "low": 0, "high": 255}
    {"type": "Box", "shape": [4], "low": [-4.8, null, -0.42, null], "high": [...]}  # dtype float32
    {"type": "Discrete", "n": 5, "start": 0}
    {"type": "MultiDiscrete", "nvec": [3, 4], "start": [0, 0]}
    {"type": "MultiBinary", "n": 6}            (or "n": [2, 3] for a shaped one)
    {"type": "Dict", "spaces": {"camera": {...}, "speed": {...}}}   # keys keep their order
    {"type": "Tuple", "spaces": [{...}, {...}]}

Box, Discrete, MultiDiscrete and MultiBinary are *leaves*; Dict and Tuple nest them up to
``MAX_DEPTH`` levels and ``MAX_LEAVES`` leaves. ``space.leaves()`` lists the leaves depth
first; everything downstream (step records, train-batch columns, ONNX inputs, action
vectors, distribution inputs) is laid out in that order.

Each leaf knows how one step of it is *stored* (``record_dtype``/``record_shape``: a uint8
image stays uint8 end to end) and, as an action, how wide it is in the float32 action
vector (``action_width``: 0-based indices for Discrete/MultiDiscrete, 0/1 for MultiBinary,
floats for Box) and in the distribution inputs (``dist_width``). ``check`` validates a
time-major column of values in one vectorised pass and returns an error naming the leaf.
"""
from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

BOUND_TOLERANCE = 1e-4
SMALL_BOX_SIZE = 16  # float Boxes up to this many elements have a plain-Python check of one value
MAX_DEPTH = 8
"""Deepest nesting of Dict/Tuple spaces accepted."""
MAX_LEAVES = 64
"""Most leaves one space may have."""
KEY_PATTERN = re.compile(r"[A-Za-z0-9_\-]{1,64}")
"""Dict keys: they become record field, batch column and ONNX input names."""

BOX_DTYPES = {"float32": "<f4", "float64": "<f4", "float16": "<f4", "uint8": "|u1",
              "int8": "|i1", "uint16": "<u2", "int16": "<i2", "int32": "<i4", "int64": "<i8",
              "bool": "|b1"}
"""Box dtypes accepted, and how a step of each is stored (floats as float32)."""


class SpaceError(ValueError):
    """A space description is malformed or unsupported."""


class InvalidValue(ValueError):
    """Values (observations or actions) do not fit their space; the message names the leaf."""


SHAPE_MISMATCH = "space wants"  # in every InvalidValue message about a value of the wrong shape


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _positive_ints(value: Any, what: str, allow_empty: bool = False) -> tuple[int, ...]:
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if (not isinstance(value, (list, tuple)) or (not value and not allow_empty)
            or not all(_is_int(d) and d >= 1 for d in value)):
        raise SpaceError(f"{what} must be a non-empty list of positive integers, got {value!r}")
    return tuple(int(d) for d in value)


def _flatten(value: Any) -> list:
    out: list = []
    for v in value:
        out.extend(_flatten(v) if isinstance(v, (list, tuple)) else [v])
    return out


def _bounds(value: Any, size: int, default: float, name: str) -> tuple[float, ...]:
    """A JSON bound (number, null, or a nested list of them) → ``size`` floats."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if value is None:
        bounds = (default,) * size
    elif _is_number(value):
        bounds = (float(value),) * size
    elif isinstance(value, (list, tuple)):
        flat = _flatten(value)
        if not all(v is None or _is_number(v) for v in flat):
            raise SpaceError(f"{name} must hold only numbers and nulls")
        if len(flat) != size:
            raise SpaceError(f"{name} has {len(flat)} values, shape needs {size}")
        bounds = tuple(default if v is None else float(v) for v in flat)
    else:
        raise SpaceError(f"{name} must be a number, null or a list")
    if any(math.isnan(v) for v in bounds):
        raise SpaceError(f"{name} must not be NaN")
    return bounds


def _bound_json(values: tuple[float, ...]) -> Any:
    """One number when every element shares it (images), else a list; infinities → null."""
    fin = [v if math.isfinite(v) else None for v in values]
    return fin[0] if len(set(fin)) == 1 else fin


@dataclass(frozen=True)
class Leaf:
    """A leaf space at ``path`` inside a (possibly composite) space.

    ``key`` joins the path with dots ("" for a root leaf); it names the leaf's record field,
    batch column and ONNX input. ``display(prefix)`` is the path for error messages.
    """

    path: tuple[str | int, ...]
    space: LeafSpace

    @property
    def key(self) -> str:
        return path_key(self.path)

    def display(self, prefix: str) -> str:
        return path_display(prefix, self.path)


def path_key(path: tuple[str | int, ...]) -> str:
    """A leaf's key: its path joined by dots ("" for the root)."""
    return ".".join(str(p) for p in path)


def path_display(prefix: str, path: tuple[str | int, ...]) -> str:
    """A path for error messages: obs["camera"][0]."""
    return prefix + "".join(f'["{p}"]' if isinstance(p, str) else f"[{p}]" for p in path)


class Space(ABC):
    """Base of every space. Build with the family classes, ``space_from_json`` or
    ``space_from_gym``; all are immutable values (equal when their descriptions are)."""

    @abstractmethod
    def to_json(self) -> dict[str, Any]:
        """The JSON form (see the module docstring); ``space_from_json`` inverts it."""

    @abstractmethod
    def to_gym(self) -> Any:
        """The equivalent gymnasium space."""

    @abstractmethod
    def leaves(self) -> tuple[Leaf, ...]:
        """Leaf spaces, depth first, with their paths."""

    def leaf(self, key: str) -> Leaf:
        """The leaf whose ``key`` is ``key``; KeyError if there is none."""
        for leaf in self.leaves():
            if leaf.key == key:
                return leaf
        raise KeyError(key)

    @property
    def action_size(self) -> int:
        """Width of this space's float32 action vector (sum over leaves)."""
        return sum(leaf.space.action_width for leaf in self.leaves())

    @property
    def dist_size(self) -> int:
        """Width of this space's distribution inputs (sum over leaves)."""
        return sum(leaf.space.dist_width for leaf in self.leaves())


class LeafSpace(Space):
    """A space holding numbers (not other spaces)."""

    record_dtype: np.dtype
    record_shape: tuple[int, ...]

    def leaves(self) -> tuple[Leaf, ...]:
        return (Leaf((), self),)

    @property
    @abstractmethod
    def action_width(self) -> int:
        """Numbers this leaf takes in the float32 action vector."""

    @property
    @abstractmethod
    def dist_width(self) -> int:
        """Numbers this leaf takes in the distribution inputs."""

    @abstractmethod
    def check(self, values: np.ndarray, what: str) -> str | None:
        """Error (naming ``what``) unless ``values`` [T, *record_shape] all lie in the space."""

    def check_action_vector(self, vec: np.ndarray, what: str) -> str | None:
        """Error unless ``vec`` [T, action_width] holds valid action-vector entries."""
        raise SpaceError(f"{type(self).__name__} cannot be an action space")

    def to_action_vector(self, values: np.ndarray) -> np.ndarray:
        """Validated values [T, *record_shape] → float32 [T, action_width] (indices)."""
        raise SpaceError(f"{type(self).__name__} {self.to_json()} cannot be an action space")

    def from_action_vector(self, vec: np.ndarray) -> np.ndarray:
        """float32 [T, action_width] → values [T, *record_shape] in the record dtype."""
        raise SpaceError(f"{type(self).__name__} cannot be an action space")

    def _check_shape(self, values: np.ndarray, what: str) -> str | None:
        if values.shape[1:] != self.record_shape:
            return f"{what}: shape {list(values.shape[1:])}, {SHAPE_MISMATCH} {list(self.record_shape)}"
        if values.dtype.kind not in "biuf":
            return f"{what}: values must be numbers"
        return None


# ---------------------------------------------------------------- Box
@dataclass(frozen=True, eq=True)
class Box(LeafSpace):
    """Numbers of ``shape`` with per-element bounds (stored flattened). Rank-3 Boxes are
    images (height, width, channels). Floats are stored as float32, others as themselves."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    low: Any = None    # a number, nested list or None (dtype's range); stored as a flat tuple
    high: Any = None

    def __post_init__(self) -> None:
        shape = _positive_ints(self.shape, "Box shape")
        if self.dtype not in BOX_DTYPES:
            raise SpaceError(f"Box dtype {self.dtype!r} is not supported ({', '.join(BOX_DTYPES)})")
        size = math.prod(shape)
        default_low, default_high = self._default_bounds()
        low = _bounds(self.low, size, default_low, "low")
        high = _bounds(self.high, size, default_high, "high")
        if any(a > b for a, b in zip(low, high)):
            raise SpaceError("Box low must not exceed high")
        for name, value in (("shape", shape), ("low", low), ("high", high)):
            object.__setattr__(self, name, value)

    def _default_bounds(self) -> tuple[float, float]:
        if self.dtype == "bool":
            return 0.0, 1.0
        if self.dtype.startswith(("int", "uint")):
            info = np.iinfo(self.dtype)
            return float(info.min), float(info.max)
        return -math.inf, math.inf

    @property
    def record_dtype(self) -> np.dtype:  # type: ignore[override]
        return np.dtype(BOX_DTYPES[self.dtype])

    @property
    def record_shape(self) -> tuple[int, ...]:  # type: ignore[override]
        return self.shape

    @property
    def is_float(self) -> bool:
        return self.dtype.startswith("float")

    @property
    def is_image(self) -> bool:
        """Rank 3, channels last: encoded by a CNN."""
        return len(self.shape) == 3

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @cached_property
    def low_array(self) -> np.ndarray:
        return np.asarray(self.low, np.float64).reshape(self.shape)

    @cached_property
    def high_array(self) -> np.ndarray:
        return np.asarray(self.high, np.float64).reshape(self.shape)

    @property
    def action_width(self) -> int:
        if not self.is_float:
            raise SpaceError(f"an integer Box ({self.dtype}) cannot be an action space: "
                             f"use MultiDiscrete")
        return self.size

    @property
    def dist_width(self) -> int:
        return 2 * self.action_width

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"type": "Box", "shape": list(self.shape)}
        if self.dtype != "float32":
            d["dtype"] = self.dtype
        return {**d, "low": _bound_json(self.low), "high": _bound_json(self.high)}

    def to_gym(self) -> Any:
        import gymnasium as gym
        dtype = np.dtype(self.dtype)
        return gym.spaces.Box(self.low_array.astype(dtype), self.high_array.astype(dtype),
                              self.shape, dtype)

    def check(self, values: np.ndarray, what: str) -> str | None:
        error = self._check_shape(values, what)
        if error or not values.size:
            return error
        if values.dtype.kind == "f" and not np.isfinite(values).all():
            return f"{what}: contains NaN or Inf"
        if not self.is_float and values.dtype.kind == "f" and (values != np.floor(values)).any():
            return f"{what}: values must be whole numbers ({self.dtype})"
        if self._bounds_cover(values.dtype):
            return None
        low, high = self._slack_bounds()
        # per-element extremes over the steps first (one pass each in the values' own dtype),
        # then only [*shape] float comparisons: an 84x84x3 uint8 image is checked ~5x faster
        # than comparing every value against float64 bounds
        if (values.min(axis=0) < low).any() or (values.max(axis=0) > high).any():
            return f"{what}: values outside the declared Box bounds"
        return None

    def _bounds_cover(self, dtype: np.dtype) -> bool:
        """Whether no value of integer/bool ``dtype`` can lie outside the bounds (a uint8
        image Box of [0, 255]: nothing to compare)."""
        if dtype.kind not in "biu":
            return False
        info = np.iinfo(np.uint8 if dtype.kind == "b" else dtype)
        dmin, dmax = (0, 1) if dtype.kind == "b" else (info.min, info.max)
        return self._loosest_bounds[0] <= dmin and self._loosest_bounds[1] >= dmax

    @cached_property
    def _loosest_bounds(self) -> tuple[float, float]:
        """(largest low, smallest high): every element's bounds contain [that low, that high]."""
        return float(self.low_array.max()), float(self.high_array.min())

    @cached_property
    def _slack(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.is_float:
            return self.low_array, self.high_array
        return self.low_array - tolerance(self.low_array), self.high_array + tolerance(self.high_array)

    @cached_property
    def small_float_bounds(self) -> tuple[list[float], list[float]] | None:
        """(lows, highs) as Python floats for a float Box of at most SMALL_BOX_SIZE elements:
        the slack bounds, inside the float32 range; None for any other Box. One value strictly
        between them is valid (``columns.to_columns``'s plain-Python check of one step)."""
        if not self.is_float or math.prod(self.shape) > SMALL_BOX_SIZE:
            return None
        f32_max = float(np.finfo(np.float32).max)
        low, high = self._slack
        return (np.maximum(low, -f32_max).ravel().tolist(), np.minimum(high, f32_max).ravel().tolist())

    def _slack_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Float bounds widened by BOUND_TOLERANCE relative to their magnitude (float32
        rounding of a bound must not refuse a valid value); integer bounds are exact.
        Computed once per space (this runs for every fragment and every act())."""
        return self._slack

    def to_action_vector(self, values: np.ndarray) -> np.ndarray:
        return np.asarray(values, np.float32).reshape(len(values), self.action_width)

    def check_action_vector(self, vec: np.ndarray, what: str) -> str | None:
        return self.check(vec.reshape(len(vec), *self.shape), what)

    def from_action_vector(self, vec: np.ndarray) -> np.ndarray:
        clipped = np.clip(vec, self.low_array.reshape(-1), self.high_array.reshape(-1))
        return clipped.astype(np.float32).reshape(len(vec), *self.shape)


def tolerance(bound: np.ndarray) -> np.ndarray:
    """Slack of each bound: BOUND_TOLERANCE relative to its magnitude (absolute near zero)."""
    return BOUND_TOLERANCE * (1.0 + np.abs(np.where(np.isfinite(bound), bound, 0.0)))


# ---------------------------------------------------------------- Discrete, MultiDiscrete
def _check_integers(values: np.ndarray, low: np.ndarray, high: np.ndarray, what: str) -> str | None:
    """values must be whole numbers with low <= v < high (broadcast per component)."""
    if values.dtype.kind == "f":
        if not np.isfinite(values).all():
            return f"{what}: contains NaN or Inf"
        if (values != np.floor(values)).any():
            return f"{what}: values must be integers"
    if (values < low).any() or (values >= high).any():
        lo, hi = np.ravel(low), np.ravel(high)
        bounds = (f"[{int(lo[0])}, {int(hi[0])})" if lo.size == 1
                  else "[start, start + nvec) per component")
        return f"{what}: values must be integers in {bounds}"
    return None


@dataclass(frozen=True)
class Discrete(LeafSpace):
    """One of ``n`` choices, ``start`` .. ``start + n - 1``. Stored as int64 (its value);
    as an action the vector holds the 0-based index (value - start)."""

    n: int
    start: int = 0

    def __post_init__(self) -> None:
        if not _is_int(self.n) or self.n < 1:
            raise SpaceError(f"Discrete n must be a positive integer, got {self.n!r}")
        if not _is_int(self.start):
            raise SpaceError(f"Discrete start must be an integer, got {self.start!r}")
        object.__setattr__(self, "n", int(self.n))
        object.__setattr__(self, "start", int(self.start))

    record_dtype = np.dtype("<i8")
    record_shape = ()
    action_width = 1

    @property
    def dist_width(self) -> int:
        return self.n

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"type": "Discrete", "n": self.n}
        return {**d, "start": self.start} if self.start else d

    def to_gym(self) -> Any:
        import gymnasium as gym
        return gym.spaces.Discrete(self.n, start=self.start)

    def check(self, values: np.ndarray, what: str) -> str | None:
        return self._check_shape(values, what) or _check_integers(
            values, np.asarray(self.start), np.asarray(self.start + self.n), what)

    def to_action_vector(self, values: np.ndarray) -> np.ndarray:
        return (np.asarray(values, np.float64) - self.start).astype(np.float32).reshape(-1, 1)

    def check_action_vector(self, vec: np.ndarray, what: str) -> str | None:
        return _check_integers(vec[:, 0], np.asarray(0), np.asarray(self.n), what)

    def from_action_vector(self, vec: np.ndarray) -> np.ndarray:
        return np.rint(vec[:, 0]).astype(np.int64) + self.start


@dataclass(frozen=True)
class MultiDiscrete(LeafSpace):
    """k independent choices, component i one of ``nvec[i]`` starting at ``start[i]``."""

    nvec: tuple[int, ...]
    start: Any = None  # one integer per component (default zeros); stored as a tuple

    def __post_init__(self) -> None:
        nvec = _positive_ints(self.nvec, "MultiDiscrete nvec")
        start = (0,) * len(nvec) if self.start is None else self.start
        if isinstance(start, np.ndarray):
            start = start.tolist()
        if (not isinstance(start, (list, tuple)) or len(start) != len(nvec)
                or not all(_is_int(s) for s in start)):
            raise SpaceError("MultiDiscrete start must be one integer per nvec entry")
        object.__setattr__(self, "nvec", nvec)
        object.__setattr__(self, "start", tuple(int(s) for s in start))

    record_dtype = np.dtype("<i8")

    @property
    def record_shape(self) -> tuple[int, ...]:  # type: ignore[override]
        return (len(self.nvec),)

    @property
    def action_width(self) -> int:
        return len(self.nvec)

    @property
    def dist_width(self) -> int:
        return sum(self.nvec)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"type": "MultiDiscrete", "nvec": list(self.nvec)}
        return {**d, "start": list(self.start)} if any(self.start) else d

    def to_gym(self) -> Any:
        import gymnasium as gym
        return gym.spaces.MultiDiscrete(list(self.nvec), start=list(self.start))

    def check(self, values: np.ndarray, what: str) -> str | None:
        start = np.asarray(self.start)
        return self._check_shape(values, what) or _check_integers(
            values, start, start + np.asarray(self.nvec), what)

    def to_action_vector(self, values: np.ndarray) -> np.ndarray:
        return (np.asarray(values, np.float64) - np.asarray(self.start)).astype(np.float32)

    def check_action_vector(self, vec: np.ndarray, what: str) -> str | None:
        return _check_integers(vec, np.zeros(len(self.nvec)), np.asarray(self.nvec), what)

    def from_action_vector(self, vec: np.ndarray) -> np.ndarray:
        return np.rint(vec).astype(np.int64) + np.asarray(self.start, np.int64)


@dataclass(frozen=True)
class MultiBinary(LeafSpace):
    """0/1 values of ``shape`` (``n`` elements); stored as int8. As an action: Bernoulli
    per element. A MultiBinary observation can be the action mask (``action_mask_key``)."""

    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        shape = (self.shape,) if _is_int(self.shape) else self.shape
        object.__setattr__(self, "shape", _positive_ints(shape, "MultiBinary n"))

    record_dtype = np.dtype("|i1")

    @property
    def record_shape(self) -> tuple[int, ...]:  # type: ignore[override]
        return self.shape

    @property
    def n(self) -> int:
        return math.prod(self.shape)

    @property
    def action_width(self) -> int:
        return self.n

    @property
    def dist_width(self) -> int:
        return self.n

    def to_json(self) -> dict[str, Any]:
        return {"type": "MultiBinary", "n": self.shape[0] if len(self.shape) == 1 else list(self.shape)}

    def to_gym(self) -> Any:
        import gymnasium as gym
        return gym.spaces.MultiBinary(self.shape[0] if len(self.shape) == 1 else list(self.shape))

    def check(self, values: np.ndarray, what: str) -> str | None:
        error = self._check_shape(values, what)
        if error is None and values.size and ((values != 0) & (values != 1)).any():
            return f"{what}: MultiBinary values must be 0 or 1"
        return error

    def to_action_vector(self, values: np.ndarray) -> np.ndarray:
        return np.asarray(values, np.float32).reshape(len(values), self.n)

    def check_action_vector(self, vec: np.ndarray, what: str) -> str | None:
        return self.check(vec.reshape(len(vec), *self.shape), what)

    def from_action_vector(self, vec: np.ndarray) -> np.ndarray:
        return (vec > 0.5).astype(np.int8).reshape(len(vec), *self.shape)


# ---------------------------------------------------------------- Dict, Tuple
@dataclass(frozen=True)
class Dict(Space):
    """Named sub-spaces, in declared order."""

    spaces: tuple[tuple[str, Space], ...]

    def __post_init__(self) -> None:
        items = tuple(self.spaces.items()) if isinstance(self.spaces, Mapping) else tuple(self.spaces)
        if not items:
            raise SpaceError("a Dict space needs at least one key")
        for key, sub in items:
            if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
                raise SpaceError(f"Dict key {key!r}: use 1-64 letters, digits, '_' or '-'")
            if not isinstance(sub, Space):
                raise SpaceError(f"Dict key {key!r} does not hold a space")
        if len({k for k, _ in items}) != len(items):
            raise SpaceError("Dict keys must be unique")
        object.__setattr__(self, "spaces", items)
        _check_limits(self)

    def __getitem__(self, key: str) -> Space:
        return dict(self.spaces)[key]

    def __contains__(self, key: object) -> bool:
        return any(k == key for k, _ in self.spaces)

    def keys(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.spaces)

    def to_json(self) -> dict[str, Any]:
        return {"type": "Dict", "spaces": {k: s.to_json() for k, s in self.spaces}}

    def to_gym(self) -> Any:
        import gymnasium as gym
        from collections import OrderedDict
        return gym.spaces.Dict(OrderedDict((k, s.to_gym()) for k, s in self.spaces))

    def leaves(self) -> tuple[Leaf, ...]:
        return tuple(Leaf((k, *leaf.path), leaf.space) for k, s in self.spaces for leaf in s.leaves())


@dataclass(frozen=True)
class Tuple(Space):
    """Positional sub-spaces."""

    spaces: tuple[Space, ...]

    def __post_init__(self) -> None:
        items = tuple(self.spaces)
        if not items or not all(isinstance(s, Space) for s in items):
            raise SpaceError("a Tuple space needs at least one sub-space")
        object.__setattr__(self, "spaces", items)
        _check_limits(self)

    def to_json(self) -> dict[str, Any]:
        return {"type": "Tuple", "spaces": [s.to_json() for s in self.spaces]}

    def to_gym(self) -> Any:
        import gymnasium as gym
        return gym.spaces.Tuple([s.to_gym() for s in self.spaces])

    def leaves(self) -> tuple[Leaf, ...]:
        return tuple(Leaf((i, *leaf.path), leaf.space)
                     for i, s in enumerate(self.spaces) for leaf in s.leaves())


def depth(space: Space) -> int:
    """Nesting levels of Dict/Tuple (a leaf is 0)."""
    if isinstance(space, Dict):
        return 1 + max(depth(s) for _, s in space.spaces)
    if isinstance(space, Tuple):
        return 1 + max(depth(s) for s in space.spaces)
    return 0


def _check_limits(space: Space) -> None:
    if depth(space) > MAX_DEPTH:
        raise SpaceError(f"spaces nest at most {MAX_DEPTH} levels deep")
    if len(space.leaves()) > MAX_LEAVES:
        raise SpaceError(f"a space has at most {MAX_LEAVES} leaves")


# ---------------------------------------------------------------- JSON and gymnasium
def space_from_json(d: object) -> Space:
    """From a decoded JSON value (or a TOML table); SpaceError unless it is a valid space."""
    if not isinstance(d, Mapping):
        raise SpaceError("a space must be a table/object")
    kind = str(d.get("type", "")).lower()
    builder = _FROM_JSON.get(kind)
    if builder is None:
        raise SpaceError(f"unsupported space type {d.get('type')!r} "
                         f"(Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple are)")
    allowed = _JSON_KEYS[kind]
    unknown = sorted(set(d) - allowed - {"type"})
    if unknown:
        raise SpaceError(f"{d.get('type')}: unknown key(s) {', '.join(map(str, unknown))}")
    try:
        return builder(d)
    except (TypeError, RecursionError) as exc:
        raise SpaceError(f"malformed {d.get('type')} space: {exc}") from None


def _box_from_json(d: Mapping) -> Box:
    if "shape" not in d:
        raise SpaceError("Box needs a shape")
    dtype = d.get("dtype", "float32")
    if not isinstance(dtype, str):
        raise SpaceError("Box dtype must be a string")
    return Box(d["shape"], dtype, d.get("low"), d.get("high"))


def _dict_from_json(d: Mapping) -> Dict:
    spaces = d.get("spaces")
    if not isinstance(spaces, Mapping):
        raise SpaceError("Dict needs spaces: a table of sub-spaces")
    return Dict(tuple((k, space_from_json(v)) for k, v in spaces.items()))


def _tuple_from_json(d: Mapping) -> Tuple:
    spaces = d.get("spaces")
    if not isinstance(spaces, (list, tuple)):
        raise SpaceError("Tuple needs spaces: a list of sub-spaces")
    return Tuple(tuple(space_from_json(v) for v in spaces))


def _field(d: Mapping, key: str, default: Any = None) -> Any:
    """A JSON value to hand to a family's constructor, which checks it."""
    return d.get(key, default)


_FROM_JSON = {
    "box": _box_from_json,
    "discrete": lambda d: Discrete(_field(d, "n"), _field(d, "start", 0)),
    "multidiscrete": lambda d: MultiDiscrete(_field(d, "nvec"), _field(d, "start")),
    "multibinary": lambda d: MultiBinary(_field(d, "n")),
    "dict": _dict_from_json,
    "tuple": _tuple_from_json,
}
_JSON_KEYS = {"box": {"shape", "dtype", "low", "high"}, "discrete": {"n", "start"},
              "multidiscrete": {"nvec", "start"}, "multibinary": {"n"}, "dict": {"spaces"},
              "tuple": {"spaces"}}


def space_from_gym(space: Any) -> Space:
    """The space equivalent to a gymnasium space; SpaceError for unsupported families."""
    name = type(space).__name__
    if name == "Box":
        return Box(tuple(space.shape), np.dtype(space.dtype).name,
                   space.low.ravel().astype(np.float64).tolist(),
                   space.high.ravel().astype(np.float64).tolist())
    if name == "Discrete":
        return Discrete(int(space.n), int(space.start))
    if name == "MultiDiscrete":
        if np.ndim(space.nvec) != 1:
            raise SpaceError("only 1-D MultiDiscrete spaces are supported")
        return MultiDiscrete(tuple(int(v) for v in space.nvec), tuple(int(v) for v in space.start))
    if name == "MultiBinary":
        return MultiBinary(tuple(int(v) for v in np.atleast_1d(space.n)))
    if name == "Dict":
        return Dict(tuple((str(k), space_from_gym(s)) for k, s in space.spaces.items()))
    if name == "Tuple":
        return Tuple(tuple(space_from_gym(s) for s in space.spaces))
    raise SpaceError(f"unsupported gymnasium space {name} "
                     f"(Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple are)")


def field_name(key: str) -> str:
    """The step-record field (and train-batch column suffix) of the leaf with ``key``: the
    key itself, "obs" for a root leaf."""
    return key or "obs"


def record_fields(space: Space) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    """``StepLayout`` obs fields: (name, dtype str, per-step shape) per leaf, in leaf order."""
    return tuple((field_name(leaf.key), leaf.space.record_dtype.str, leaf.space.record_shape)
                 for leaf in space.leaves())
