"""Values of a space ↔ leaf columns: the one conversion both transports and client_lib use.

A *column set* (``Columns``) maps each leaf's key (``Leaf.key``: "" for a root leaf,
"camera", "arm.joints", "0") to a time-major array ``[rows, *record_shape]`` in the leaf's
record dtype. Step records, train batches and network inputs are all column sets.

Accepted JSON (and native python/numpy) forms of ``rows`` steps of a space:

- the RLlink form: a list of ``rows`` per-step values; one step of a Dict space is an object
  keyed exactly like the space, of a Tuple a list, of a leaf a number or nested number list;
- for a Dict space, also a *columnar* object ``{key: rows steps of that sub-space}``;
- for a leaf, also one compact array (``protocol.compact``) or ndarray ``[rows, *shape]``,
  or a list of per-step compact arrays.

Every conversion validates (structure, dtype, shape, bounds, finiteness: one vectorised pass
per leaf) and raises ``InvalidValue`` whose message names the leaf, e.g.
``obs["camera"]: shape [64, 64, 3], space wants [84, 84, 3]``. Recursion follows the
declared space (at most ``spaces.MAX_DEPTH`` levels), never the peer's JSON.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlinkd.client_lib.protocol.compact import (COMPACT_MIN_BYTES, CompactError, decode_compact,
                                                encode_compact, is_compact)
from rlinkd.client_lib.protocol.wire import F32_MAX
from rlinkd.client_lib.protocol.spaces import (SHAPE_MISMATCH, Box, Dict, Discrete, InvalidValue, LeafSpace,
                                               Space, Tuple, path_display, path_key)

Columns = dict[str, np.ndarray]


def to_columns(value: Any, space: Space, rows: int, prefix: str) -> Columns:
    """``rows`` steps of ``space`` (any accepted form) → validated leaf columns.

    ``prefix`` starts every error path ("episodes[0].obs"). Raises InvalidValue."""
    if type(value) is list and len(value) == rows:
        if rows == 1:
            one = _one_small_box(value[0], space)
            if one is not None:
                return one
        elif 1 < rows <= SMALL_ROWS:
            few = _few_small_boxes(value, space)
            if few is not None:
                return few
    out: Columns = {}
    _collect(value, space, (), rows, prefix, out)
    return out


EXACT_INT = 2**53  # integers the fast check takes: exact as a double, so one float32 rounding as
                  # in the general path (a larger one is rounded twice in np.array(list, float32))


def _one_small_box(value: Any, space: Space) -> Columns | None:
    """One step of a small float Box, given as a float ndarray of the Box's shape (a
    client-side agent's obs) or, for a 1-D Box, a list of JSON numbers (a serving request),
    with every value strictly inside the bounds: checked in plain Python floats (~2 us; the
    general path ~11-19 us, for every step). None: anything else, left to the general path
    (which also words the error). NaN fails every comparison, so it is never accepted here;
    nor is an integer beyond 2**53 (the general path refuses one numpy cannot hold, and
    rounds a large one to float32 once: through a double here it would round twice)."""
    if type(space) is not Box:
        return None
    bounds = space.small_float_bounds
    if bounds is None:
        return None
    lows, highs = bounds
    if type(value) is list:
        if len(space.shape) != 1 or len(value) != space.shape[0] or not all(
                (type(x) is float or (type(x) is int and -EXACT_INT <= x <= EXACT_INT)) and lo < x < hi
                for x, lo, hi in zip(value, lows, highs)):
            return None
        return {"": np.array(value, np.float32).reshape(1, len(value))}
    if type(value) is not np.ndarray or value.dtype.kind != "f" or value.shape != space.shape:
        return None
    if all(lo < x < hi for x, lo, hi in zip(value.ravel().tolist(), lows, highs)):
        return {"": value.astype(np.float32).reshape(1, *space.shape)}
    return None


SMALL_ROWS = 16  # up to this many steps of a small Box are checked row by row in plain floats


def _few_small_boxes(value: list, space: Space) -> Columns | None:
    """Several steps of a small 1-D float Box as lists of JSON numbers (a STEP_BATCH's few
    entries, e.g. a C client's END + START): ``_one_small_box``'s check per row, one array
    for all. None: anything else, left to the general path."""
    if type(space) is not Box or len(space.shape) != 1:
        return None
    rows = [_one_small_box(v, space) if type(v) is list else None for v in value]
    if any(row is None for row in rows):
        return None
    return {"": np.array(value, np.float32).reshape(len(value), space.shape[0])}


def _collect(value: Any, space: Space, path: tuple, rows: int, prefix: str, out: Columns) -> None:
    if isinstance(space, LeafSpace):
        out[path_key(path)] = leaf_column(value, space, rows, path_display(prefix, path))
    elif isinstance(space, Dict):
        where = path_display(prefix, path)
        if isinstance(value, Mapping) and not is_compact(value):  # columnar
            _expect_keys(value, space, where)
            for key, sub in space.spaces:
                _collect(value[key], sub, (*path, key), rows, prefix, out)
            return
        steps = _steps(value, rows, where)
        for step in steps:
            if not isinstance(step, Mapping):
                raise InvalidValue(f"{where}: each step must be an object keyed like the Dict space")
            _expect_keys(step, space, where)
        for key, sub in space.spaces:
            _collect([s[key] for s in steps], sub, (*path, key), rows, prefix, out)
    elif isinstance(space, Tuple):
        where = path_display(prefix, path)
        steps = _steps(value, rows, where)
        width = len(space.spaces)
        if not all(isinstance(s, (list, tuple)) and len(s) == width for s in steps):
            raise InvalidValue(f"{where}: each step must be a list of {width} values (a Tuple)")
        for i, sub in enumerate(space.spaces):
            _collect([s[i] for s in steps], sub, (*path, i), rows, prefix, out)


def _expect_keys(value: Mapping, space: Dict, where: str) -> None:
    if set(value) != set(space.keys()):
        missing = sorted(set(space.keys()) - set(value))
        extra = sorted(str(k)[:32] for k in set(value) - set(space.keys()))
        raise InvalidValue(f"{where}: keys do not match the Dict space (missing {missing}, "
                           f"unexpected {extra})")


def _steps(value: Any, rows: int, where: str) -> list | tuple:
    if not isinstance(value, (list, tuple)):
        raise InvalidValue(f"{where}: expected a list of {rows} steps")
    if len(value) != rows:
        raise InvalidValue(f"{where}: {len(value)} steps, expected {rows}")
    return value


def leaf_column(value: Any, space: LeafSpace, rows: int, what: str) -> np.ndarray:
    """One leaf's ``rows`` steps → [rows, *record_shape] in the record dtype, validated."""
    try:
        arr = _as_array(value, what)
    except _Ragged:
        raise InvalidValue(_ragged_message(value, space, what)) from None
    if arr.ndim == 1 and space.record_shape == (1,) and len(arr) == rows:
        arr = arr.reshape(rows, 1)        # [T] for a one-element Box/MultiBinary
    elif arr.ndim == 2 and space.record_shape == () and arr.shape[1:] == (1,):
        arr = arr.reshape(len(arr))       # [T, 1] for a Discrete
    elif arr.size == 0 and rows == 0:
        arr = arr.reshape(0, *space.record_shape)
    if arr.ndim == 0 or len(arr) != rows:
        raise InvalidValue(f"{what}: {len(arr) if arr.ndim else 'a scalar, not'} steps, "
                           f"expected {rows}")
    error = space.check(arr, what) or _float32_range(arr, space, what)
    if error:
        raise InvalidValue(error)
    return np.ascontiguousarray(arr, space.record_dtype)


def _float32_range(arr: np.ndarray, space: LeafSpace, what: str) -> str | None:
    """Float leaves are stored as float32: 1e308 would become inf."""
    if (space.record_dtype.kind == "f" and arr.dtype.itemsize > 4 and arr.size
            and np.abs(arr).max() > F32_MAX):
        return f"{what}: values beyond the float32 range"
    return None


def _as_array(value: Any, what: str) -> np.ndarray:
    """A JSON/native column → a numeric ndarray (no space checks yet). Raises InvalidValue,
    or _Ragged when numpy cannot make one array of a list."""
    if isinstance(value, np.ndarray):
        arr = value
    elif is_compact(value):
        arr = _decode(value, what)
    elif isinstance(value, (list, tuple)) and value and is_compact(value[0]):
        if not all(is_compact(v) for v in value):
            raise InvalidValue(f"{what}: mixes compact arrays and plain lists")
        arrays = [_decode(v, f"{what}[{i}]") for i, v in enumerate(value)]
        if len({a.shape for a in arrays}) != 1:
            raise _Ragged
        arr = np.stack(arrays)
    elif isinstance(value, (list, tuple)):
        try:
            arr = np.asarray(value)
        except (ValueError, TypeError, OverflowError):
            raise _Ragged from None
    else:
        raise InvalidValue(f"{what}: expected a list of steps")
    if arr.dtype.kind not in "biuf":
        raise InvalidValue(f"{what}: values must be numbers")
    return arr


def _decode(value: Any, what: str) -> np.ndarray:
    try:
        return decode_compact(value, what)
    except CompactError as exc:
        raise InvalidValue(str(exc)) from None


class _Ragged(Exception):
    """numpy could not make one array of a list (steps of different shapes, or junk)."""


def _ragged_message(value: Any, space: LeafSpace, what: str) -> str:
    """Name the first step whose shape differs from the space's (or say it is not numeric)."""
    for i, step in enumerate(value if isinstance(value, (list, tuple)) else ()):
        try:
            shape = tuple(step["shape"]) if is_compact(step) else np.shape(step)
        except (ValueError, TypeError, KeyError):
            break
        if shape != space.record_shape:
            return f"{what}[{i}]: shape {list(shape)}, {SHAPE_MISMATCH} {list(space.record_shape)}"
    return f"{what}: ragged or non-numeric values"


# ---------------------------------------------------------------- actions
def action_vector(columns: Columns, space: Space) -> np.ndarray:
    """Validated action columns → float32 [T, action_size] (0-based indices for discrete
    leaves), leaves concatenated in order."""
    parts = [leaf.space.to_action_vector(columns[leaf.key]) for leaf in space.leaves()]
    return np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]


def check_action_vector(vec: np.ndarray, space: Space, what: str) -> str | None:
    """Error unless float32 action vectors [T, action_size] (as step records and the shared-
    memory transport carry them) hold valid values for every action leaf."""
    at = 0
    for leaf in space.leaves():
        width = leaf.space.action_width
        error = leaf.space.check_action_vector(vec[:, at:at + width], leaf.display(what))
        if error:
            return error
        at += width
    return None


def action_columns(vec: np.ndarray, space: Space) -> Columns:
    """float32 [T, action_size] → action columns in record dtypes (inverse of action_vector;
    Box values are clipped to their bounds)."""
    out, at = {}, 0
    for leaf in space.leaves():
        width = leaf.space.action_width
        out[leaf.key] = leaf.space.from_action_vector(np.asarray(vec)[:, at:at + width])
        at += width
    return out


# ---------------------------------------------------------------- native values
def one_action(vec: np.ndarray, space: Space) -> Any:
    """One answered action vector (float32 [action_size], e.g. a serving lane's) as its
    native value: ``native(action_columns(vec[None], space), space, 0)``, a Discrete one in
    plain Python (as ``Discrete.from_action_vector``: rint, then start; a served step's
    every answer, on both ends)."""
    if type(space) is Discrete:
        return round(float(vec[0])) + space.start
    return native(action_columns(np.array(vec, np.float32)[None], space), space, 0)


def native(columns: Columns, space: Space, row: int) -> Any:
    """One step as a gymnasium env gives/takes it: dict for Dict, tuple for Tuple, int for
    Discrete, ndarray for other leaves."""
    return _native(columns, space, (), row)


def _native(columns: Columns, space: Space, path: tuple, row: int) -> Any:
    if isinstance(space, Dict):
        return {k: _native(columns, s, (*path, k), row) for k, s in space.spaces}
    if isinstance(space, Tuple):
        return tuple(_native(columns, s, (*path, i), row) for i, s in enumerate(space.spaces))
    value = columns[path_key(path)][row]
    return int(value) if value.ndim == 0 else value


def native_batch(columns: Columns, space: Space) -> Any:
    """All rows as a gymnasium VectorEnv gives/takes them: dict of batches for Dict, tuple of
    batches for Tuple, the column [N, *shape] for a leaf (Discrete: int64 [N])."""
    return _native_batch(columns, space, ())


def _native_batch(columns: Columns, space: Space, path: tuple) -> Any:
    if isinstance(space, Dict):
        return {k: _native_batch(columns, s, (*path, k)) for k, s in space.spaces}
    if isinstance(space, Tuple):
        return tuple(_native_batch(columns, s, (*path, i)) for i, s in enumerate(space.spaces))
    column = columns[path_key(path)]
    return column.astype(np.int64) if column.ndim == 1 and column.dtype.kind in "iu" else column


OBS_SPACE_HINT = ("; the daemon's observation space is [env] observation_space (or the space of "
                  "[env] id) in its config: start it with your environment's (docs/spaces.md)")


def obs_columns(value: Any, space: Space, rows: int, what: str, *, batched: bool = False) -> Columns:
    """A client's observations → validated leaf columns (``batch_columns`` when ``batched``,
    else ``to_columns``). An InvalidValue about a shape also says where the daemon's observation
    space is set: the usual cause is a daemon started for another environment."""
    try:
        return (batch_columns if batched else to_columns)(value, space, rows, what)
    except InvalidValue as exc:
        if SHAPE_MISMATCH not in str(exc):
            raise
        raise InvalidValue(f"{exc}{OBS_SPACE_HINT}") from exc


def batch_columns(value: Any, space: Space, rows: int, prefix: str) -> Columns:
    """A VectorEnv's batched value (the form ``native_batch`` gives: dict of batches, tuple
    of batches, arrays [rows, ...]) → validated leaf columns. Raises InvalidValue."""
    out: Columns = {}
    _batch(value, space, (), rows, prefix, out)
    return out


def _batch(value: Any, space: Space, path: tuple, rows: int, prefix: str, out: Columns) -> None:
    if isinstance(space, LeafSpace):
        out[path_key(path)] = leaf_column(value, space, rows, path_display(prefix, path))
        return
    where = path_display(prefix, path)
    if isinstance(space, Dict):
        if not isinstance(value, Mapping):
            raise InvalidValue(f"{where}: expected a dict of batched values")
        _expect_keys(value, space, where)
        for key, sub in space.spaces:
            _batch(value[key], sub, (*path, key), rows, prefix, out)
    elif isinstance(space, Tuple):
        if not isinstance(value, (list, tuple)) or len(value) != len(space.spaces):
            raise InvalidValue(f"{where}: expected a tuple of {len(space.spaces)} batched values")
        for i, sub in enumerate(space.spaces):
            _batch(value[i], sub, (*path, i), rows, prefix, out)


# ---------------------------------------------------------------- to the wire
def to_wire(columns: Columns, space: Space, compact: bool) -> Any:
    """Column set → JSON-ready value. ``compact`` False: the plain RLlink per-step form (any
    RLlink server reads it). True (the server announced ``compact_arrays``): Dict spaces
    columnar, leaves of at least COMPACT_MIN_BYTES as compact arrays."""
    if not compact:
        return _per_step(columns, space, (), False)
    return _columnar(columns, space, ())


def _columnar(columns: Columns, space: Space, path: tuple) -> Any:
    if isinstance(space, Dict):
        return {k: _columnar(columns, s, (*path, k)) for k, s in space.spaces}
    if isinstance(space, Tuple):
        return _per_step(columns, space, path, True)
    col = columns[path_key(path)]
    return encode_compact(col) if col.nbytes >= COMPACT_MIN_BYTES else col


def _per_step(columns: Columns, space: Space, path: tuple, compact: bool) -> list:
    if isinstance(space, Dict):
        parts = [_per_step(columns, s, (*path, k), compact) for k, s in space.spaces]
        return [dict(zip(space.keys(), values)) for values in zip(*parts)]
    if isinstance(space, Tuple):
        parts = [_per_step(columns, s, (*path, i), compact) for i, s in enumerate(space.spaces)]
        return [list(values) for values in zip(*parts)]
    col = columns[path_key(path)]
    if compact and len(col) and col[0].nbytes >= COMPACT_MIN_BYTES:
        return [encode_compact(step) for step in col]
    return col.tolist()
