"""Observation/action space descriptions: JSON form, gymnasium conversion, validation.

``SpaceSpec`` is what the daemon declares (from a gymnasium id or the TOML config)
and what SET_CONFIG may carry as the ``observation_space``/``action_space`` extension
keys. JSON form (infinite bounds are ``null`` because JSON has no infinity)::

    {"type": "Box", "shape": [4], "low": [-4.8, null, ...], "high": [...]}
    {"type": "Discrete", "n": 2}

Validation functions are vectorised (one numpy pass per array, no per-step Python)
and return an error string or None; the collector turns a string into an ERROR reply.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

BOUND_TOLERANCE = 1e-4


class SpaceError(ValueError):
    """A space description is malformed or unsupported."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _bounds(value: Any, size: int, default: float, name: str) -> tuple[float, ...]:
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


def _shape(value: Any) -> tuple[int, ...]:
    """A Box shape: a non-empty list of positive integers."""
    if (not isinstance(value, (list, tuple)) or not value
            or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 1
                       for d in value)):
        raise SpaceError(f"Box shape must be a non-empty list of positive integers, got {value!r}")
    return tuple(int(d) for d in value)


def _flatten(value: Any) -> list:
    out: list = []
    for v in value:
        out.extend(_flatten(v) if isinstance(v, (list, tuple)) else [v])
    return out


@dataclass(frozen=True)
class SpaceSpec:
    """A Box (float) or Discrete space. Build with ``box``, ``discrete``, ``from_json``
    or ``from_gym``; bounds are stored flattened (one per element)."""

    kind: str
    shape: tuple[int, ...] = ()
    low: tuple[float, ...] = ()
    high: tuple[float, ...] = ()
    n: int = 0

    @classmethod
    def discrete(cls, n: int) -> SpaceSpec:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise SpaceError(f"Discrete n must be a positive integer, got {n!r}")
        return cls(kind="discrete", n=n)

    @classmethod
    def box(cls, shape: tuple[int, ...] | list[int], low: Any = None, high: Any = None) -> SpaceSpec:
        shape = _shape(shape)
        size = math.prod(shape)
        lo = _bounds(low, size, -math.inf, "low")
        hi = _bounds(high, size, math.inf, "high")
        if any(a > b for a, b in zip(lo, hi)):
            raise SpaceError("Box low must not exceed high")
        return cls(kind="box", shape=shape, low=lo, high=hi)

    @classmethod
    def from_json(cls, d: object) -> SpaceSpec:
        """From a decoded JSON value; ``SpaceError`` unless it is a valid space table."""
        if not isinstance(d, dict):
            raise SpaceError("a space must be a table/object")
        kind = str(d.get("type", "")).lower()
        if kind == "discrete":
            n: Any = d.get("n")  # a JSON value; discrete() checks it
            return cls.discrete(n)
        if kind == "box":
            if "shape" not in d:
                raise SpaceError("Box needs a shape")
            return cls.box(d["shape"], d.get("low"), d.get("high"))
        raise SpaceError(f"unsupported space type {d.get('type')!r} (Box and Discrete are)")

    @classmethod
    def from_gym(cls, space: Any) -> SpaceSpec:
        name = type(space).__name__
        if name == "Discrete":
            if int(getattr(space, "start", 0)) != 0:
                raise SpaceError("Discrete spaces with start != 0 are not supported")
            return cls.discrete(int(space.n))
        if name == "Box":
            return cls.box(space.shape, space.low.ravel().tolist(), space.high.ravel().tolist())
        raise SpaceError(f"unsupported gymnasium space {name} (Box and Discrete are)")

    def to_json(self) -> dict[str, Any]:
        if self.kind == "discrete":
            return {"type": "Discrete", "n": self.n}
        fin = lambda v: v if math.isfinite(v) else None  # noqa: E731 - JSON has no inf
        return {"type": "Box", "shape": list(self.shape),
                "low": [fin(v) for v in self.low], "high": [fin(v) for v in self.high]}

    @property
    def is_discrete(self) -> bool:
        return self.kind == "discrete"

    @property
    def flat_size(self) -> int:
        """Numbers per element when flattened (a Discrete space counts 1: its index)."""
        return 1 if self.is_discrete else math.prod(self.shape)

    @property
    def feature_size(self) -> int:
        """Network input width for this space as an observation (Discrete: one-hot n)."""
        return self.n if self.is_discrete else math.prod(self.shape)

# ---------------------------------------------------------------- validation
def check_discrete(values: np.ndarray, n: int, what: str) -> str | None:
    """``values`` [T] must be whole numbers in [0, n)."""
    if values.ndim != 1:
        return f"{what}: expected a flat list of integers, got shape {list(values.shape)}"
    if values.size and not np.all(np.isfinite(values)):
        return f"{what}: contains NaN or Inf"
    if values.size and (np.any(values != np.floor(values)) or values.min() < 0 or values.max() >= n):
        return f"{what}: values must be integers in [0, {n})"
    return None


def check_box(values: np.ndarray, space: SpaceSpec, what: str) -> str | None:
    """``values`` [T, *shape] must be finite and inside the bounds (small tolerance)."""
    if values.shape[1:] != space.shape:
        return f"{what}: expected shape [T, {', '.join(map(str, space.shape))}], got {list(values.shape)}"
    flat = values.reshape(len(values), space.flat_size)
    if flat.size and not np.all(np.isfinite(flat)):
        return f"{what}: contains NaN or Inf"
    # float64 bounds, each with its own slack: float32 bounds can round past a valid value
    low, high = np.asarray(space.low, np.float64), np.asarray(space.high, np.float64)
    if flat.size and (np.any(flat < low - tolerance(low)) or np.any(flat > high + tolerance(high))):
        return f"{what}: values outside the declared Box bounds"
    return None


def tolerance(bound: np.ndarray) -> np.ndarray:
    """Slack of each bound: BOUND_TOLERANCE relative to its magnitude (absolute near zero)."""
    return BOUND_TOLERANCE * (1.0 + np.abs(np.where(np.isfinite(bound), bound, 0.0)))


def check_values(values: np.ndarray, space: SpaceSpec, what: str) -> str | None:
    """Validate a time-major array of observations or actions against ``space``."""
    if space.is_discrete:
        return check_discrete(values.reshape(len(values)) if values.ndim == 2 and values.shape[1] == 1
                              else values, space.n, what)
    return check_box(values, space, what)


def to_features(values: np.ndarray, space: SpaceSpec) -> np.ndarray:
    """Turn validated observations [T, ...] into network inputs [T, feature_size] float32."""
    if space.is_discrete:
        out = np.zeros((len(values), space.n), np.float32)
        out[np.arange(len(values)), values.reshape(-1).astype(np.int64)] = 1.0
        return out
    return np.ascontiguousarray(values.reshape(len(values), space.feature_size),
                                dtype=np.float32)
