"""The compact array form: an array as base64 of its little-endian bytes (an rlinkd extension).

    {"b64": "AAECAw...", "dtype": "uint8", "shape": [84, 84, 3]}

Accepted wherever an RLlink message expects an array of numbers (observations, actions,
rewards, log-probs, distribution inputs, at any level of a Dict/Tuple observation). The server
announces it in SET_CONFIG (``compact_arrays: true``); client_lib then uses it for arrays of
at least ``COMPACT_MIN_BYTES``. An 84x84x3 uint8 image costs 28 KB this way instead of ~80 KB
of JSON numbers, and decodes with one ``b64decode`` instead of a JSON parse of 21,168 numbers.
"""
from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

DTYPES = {"bool": "|b1", "uint8": "|u1", "int8": "|i1", "uint16": "<u2", "int16": "<i2",
          "int32": "<i4", "int64": "<i8", "float32": "<f4", "float64": "<f8"}
"""dtype names accepted in a compact array, and their little-endian numpy form."""
MAX_DIMS = 8
COMPACT_MIN_BYTES = 1024
"""client_lib sends arrays of at least this many bytes compactly (when the server allows)."""
_KEYS = frozenset(("b64", "dtype", "shape"))


class CompactError(ValueError):
    """A compact array is malformed; the message says how."""


def is_compact(value: Any) -> bool:
    """True for a JSON object that claims to be a compact array (has a "b64" key)."""
    return isinstance(value, Mapping) and "b64" in value


def decode_compact(value: Mapping, what: str) -> np.ndarray:
    """The array a compact object holds (read-only, native byte order).

    Raises CompactError naming ``what`` for unknown keys or dtypes, a bad shape, bad
    base64, or a byte length that does not match dtype x shape.
    """
    if set(value) != _KEYS:
        raise CompactError(f"{what}: a compact array has exactly the keys b64, dtype, shape")
    dtype = DTYPES.get(value["dtype"]) if isinstance(value["dtype"], str) else None
    if dtype is None:
        raise CompactError(f"{what}: unknown compact dtype {str(value['dtype'])[:32]!r} "
                           f"(one of {', '.join(DTYPES)})")
    shape = _shape(value["shape"], what)
    if not isinstance(value["b64"], str):
        raise CompactError(f"{what}: b64 must be a string")
    try:
        raw = base64.b64decode(value["b64"], validate=True)
    except (binascii.Error, ValueError):
        raise CompactError(f"{what}: b64 is not valid base64") from None
    expected = math.prod(shape) * np.dtype(dtype).itemsize
    if len(raw) != expected:
        raise CompactError(f"{what}: {len(raw)} bytes, but {value['dtype']} x {list(shape)} "
                           f"needs {expected}")
    return np.frombuffer(raw, dtype).reshape(shape).astype(np.dtype(dtype).newbyteorder("="),
                                                           copy=False)


def _shape(value: Any, what: str) -> tuple[int, ...]:
    if (not isinstance(value, list) or len(value) > MAX_DIMS
            or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**31
                       for d in value)):
        raise CompactError(f"{what}: shape must be a list of at most {MAX_DIMS} "
                           f"non-negative integers")
    return tuple(value)


def encode_compact(array: np.ndarray) -> dict[str, Any]:
    """The compact form of ``array`` (any supported dtype; ValueError otherwise)."""
    array = np.asarray(array)
    name = array.dtype.name
    if name not in DTYPES:
        raise ValueError(f"dtype {name} has no compact form")
    data = np.ascontiguousarray(array, DTYPES[name]).tobytes()
    return {"b64": base64.b64encode(data).decode("ascii"), "dtype": name, "shape": list(array.shape)}
