"""The step-record contract shared by the daemon and its clients.

One fixed-size little-endian record per environment step (plus marker
records).  The observation is a list of fields ("obs leaves"), each with its
own dtype and per-step shape; A and D are the action and dist-input float
counts::

    offset      size           field           type
    0           1              flags           u8   bit0 TERMINATED, bit1 TRUNCATED,
                                                    bit2 FINAL_OBS (only the last obs of a
                                                    fragment: ends the fragment),
                                                    bit3 FLUSH (marker, no step data),
                                                    bit4 HAS_LOGP, bit5 HAS_DIST,
                                                    bit6 STREAM_END (marker: the stream's
                                                    client went away), bit7 HAS_STATE
    1           3              (pad)
    4           4              stream_id       u32  producer writes its agent slot (0: a single
                                                    agent); the daemon replaces it by its
                                                    own stream id for that slot
    8           8              weights_seq_no  i64  policy version that chose the action, -1 unknown
    16          8              ingest_id       u64  producer writes 0; the daemon fills it
    24          4              reward          f32
    28          4              action_logp     f32
    32          ...            obs             the obs fields in order; field k is
                                                    (pad to a multiple of its itemsize)
                                                    dtype_k[shape_k], itemsize_k * prod(shape_k) bytes
    a = end of obs rounded up to a multiple of 4:
    a           4*A            action          f32[A]  (Discrete action: one float holding the index)
    a+4A        4*D            dist_inputs     f32[D]
    a+4(A+D)    4*S            state           f32[S]  (recurrent policies only, S = 0
                                                    otherwise: the actor's state before this
                                                    step where HAS_STATE is set; see
                                                    ``client_lib.protocol.recurrent``)
    a+4(A+D+S)                 pad to a multiple of 8 bytes

Obs field dtypes: ``FIELD_DTYPES`` (float32, uint8, int8, int16, uint16,
int32, int64, bool).  Records start 8-aligned in every buffer of this package
(ring slots, ``empty``), so every field is naturally aligned.  A layout with a
single float32 field of O values (``StepLayout.flat``) is the original
float-only record: obs f32[O] at 32, action at 32+4O.

The numpy ``dtype`` (batch path; ``rec["obs"]`` is a nested structured array
with one field per obs field, e.g. ``rec["obs"]["camera"]`` is [N, 84, 84, 3]
uint8) and the ``struct`` (single-step path) of a ``StepLayout`` are both
derived from the same offsets; tests check they agree.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping

import numpy as np

from rlinkd.shm.errors import LayoutError

TERMINATED = 1 << 0
TRUNCATED = 1 << 1
FINAL_OBS = 1 << 2
FLUSH = 1 << 3
HAS_LOGP = 1 << 4
HAS_DIST = 1 << 5
STREAM_END = 1 << 6
HAS_STATE = 1 << 7
"""Marker (daemon-internal): the stream's client went away; no step data."""

STEP_HEADER = struct.Struct("<B3xIqQff")
"""flags .. action_logp: the first 32 bytes of every record (the struct prefix of every layout)."""
STEP_HEADER_BYTES = STEP_HEADER.size
"""Bytes before the first obs field."""
assert STEP_HEADER_BYTES == 32

_HEADER_FIELDS = (
    ("flags", "u1", 0),
    ("stream_id", "<u4", 4),
    ("weights_seq_no", "<i8", 8),
    ("ingest_id", "<u8", 16),
    ("reward", "<f4", 24),
    ("logp", "<f4", 28),
)

FIELD_DTYPES = {"<f4": "f", "|u1": "B", "|i1": "b", "<i2": "h", "<u2": "H", "<i4": "i", "<i8": "q", "|b1": "?"}
"""Allowed obs field dtypes (canonical numpy ``dtype.str``) -> their ``struct`` format letter."""
MAX_OBS_FIELDS = 256
MAX_FIELD_NAME_CHARS = 64
MAX_FIELD_NDIM = 16
MAX_RECORD_BYTES = 1 << 30
"""Upper bound on one record (a guard against absurd layouts from JSON, far above any real one)."""

ObsField = tuple[str, str, tuple[int, ...]]
"""(name, canonical numpy dtype str, per-step shape), e.g. ("camera", "|u1", (84, 84, 3))."""


class StepLayout:
    """Byte layout of step records: obs fields (own dtype and shape each), A action and D dist floats.

    Immutable value object; build once per stream (cheap).  ``obs_fields`` is a
    non-empty sequence of (name, dtype, shape): names printable ASCII without
    spaces, 1..64 chars, unique; dtype anything ``np.dtype`` turns into one of
    ``FIELD_DTYPES``; shape a tuple of ints >= 1 (``()`` for a scalar).
    ``action_size`` >= 1, ``dist_size`` >= 0, ``state_size`` >= 0 (0: no state field, the
    record of a feed-forward policy, byte-identical to the layout before state existed).
    ValueError otherwise.
    """

    def __init__(self, obs_fields, action_size: int, dist_size: int, state_size: int = 0) -> None:
        self.obs_fields: tuple[ObsField, ...] = _check_fields(obs_fields)
        sizes = (action_size, dist_size, state_size)
        if not all(map(_is_int, sizes)) or action_size < 1 or dist_size < 0 or state_size < 0:
            raise ValueError(f"bad step layout sizes action={action_size!r} dist={dist_size!r} "
                             f"state={state_size!r}")
        self.action_size, self.dist_size, self.state_size = map(int, sizes)
        self.obs_offset = STEP_HEADER_BYTES
        self.field_offsets, obs_end = _field_offsets(self.obs_fields, self.obs_offset)
        """Absolute byte offset of each obs field, in ``obs_fields`` order."""
        self.action_offset = _align(obs_end, 4)
        self.dist_offset = self.action_offset + 4 * self.action_size
        self.state_offset = self.dist_offset + 4 * self.dist_size
        payload_end = self.state_offset + 4 * self.state_size
        self.record_bytes = _align(payload_end, 8)
        if self.record_bytes > MAX_RECORD_BYTES:
            raise ValueError(f"step record of {self.record_bytes} bytes exceeds {MAX_RECORD_BYTES}")
        self.is_flat = len(self.obs_fields) == 1 and self.obs_fields[0][1] == "<f4"
        """One float32 obs field: the original record, with the generated ``write_step`` fast path."""
        self.struct = struct.Struct(self._struct_format(payload_end))
        self.dtype = self._numpy_dtype()

    @classmethod
    def flat(cls, obs_size: int, action_size: int, dist_size: int, name: str = "obs",
             state_size: int = 0) -> StepLayout:
        """One float32 obs field of ``obs_size`` values: byte-identical to the float-only record."""
        if not _is_int(obs_size) or obs_size < 1:
            raise ValueError(f"bad step layout sizes obs={obs_size!r}")
        return cls(((name, "<f4", (int(obs_size),)),), action_size, dist_size, state_size)

    def _struct_format(self, payload_end: int) -> str:
        parts, pos = [STEP_HEADER.format], self.obs_offset
        for (_, dtype, shape), offset in zip(self.obs_fields, self.field_offsets):
            parts += [_pad(offset - pos), f"{math.prod(shape)}{FIELD_DTYPES[dtype]}"]
            pos = offset + _field_bytes(dtype, shape)
        parts += [_pad(self.action_offset - pos), f"{self.action_size}f"]
        parts += [f"{self.dist_size}f" if self.dist_size else ""]
        parts += [f"{self.state_size}f" if self.state_size else "", _pad(self.record_bytes - payload_end)]
        return "".join(parts)

    def _numpy_dtype(self) -> np.dtype:
        obs = np.dtype({"names": [name for name, _, _ in self.obs_fields],
                        "formats": [(dtype, shape) for _, dtype, shape in self.obs_fields],
                        "offsets": [off - self.obs_offset for off in self.field_offsets],
                        "itemsize": self.action_offset - self.obs_offset})
        names = [name for name, _, _ in _HEADER_FIELDS] + ["obs", "action", "dist"]
        formats = [fmt for _, fmt, _ in _HEADER_FIELDS] + [
            obs, ("<f4", (self.action_size,)), ("<f4", (self.dist_size,))]
        offsets = [off for _, _, off in _HEADER_FIELDS] + [self.obs_offset, self.action_offset, self.dist_offset]
        if self.state_size:  # (no "state" field at all in a feed-forward policy's records)
            names.append("state")
            formats.append(("<f4", (self.state_size,)))
            offsets.append(self.state_offset)
        return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": self.record_bytes})

    def empty(self, n_records: int) -> np.ndarray:
        """A zero-filled array of ``n_records`` records (e.g. for ``write_batch``)."""
        return np.zeros(n_records, dtype=self.dtype)

    def write_obs(self, dst: np.ndarray, obs) -> None:
        """Copy observations into ``dst`` (``rec["obs"]`` of some records, or one 0-d record slot).

        ``obs``: a mapping {field name: array of shape ``dst.shape + field shape``} with
        exactly the layout's names, or (single-field layouts only) that array itself.
        Values keep their dtype where it is the field's; integer/bool values may go into
        integer/bool fields when they fit, anything numeric into float32 fields.  Raises
        ValueError (naming the field) on a missing/extra key, a wrong shape, a float into
        an integer field or an out-of-range integer; ``dst`` may then be partly written.
        Called by ``fragment_records`` and the generic ``StepRing.write_step``.
        """
        values = _obs_mapping(self.obs_fields, obs)
        for name, dtype, _ in self.obs_fields:
            target = dst[name]
            src = np.asarray(values[name])
            if src.shape != target.shape:
                raise ValueError(f"obs[{name!r}] has shape {src.shape}, the step layout expects {target.shape}")
            _check_castable(name, src, np.dtype(dtype))
            np.copyto(target, src, casting="unsafe")

    def to_json(self) -> dict:
        """JSON form: {"obs_fields": [[name, dtype, [dims]], ...], "action_size", "dist_size",
        "record_bytes"}, plus "state_size" when it is not 0 (additive)."""
        d = {
            "obs_fields": [[name, dtype, list(shape)] for name, dtype, shape in self.obs_fields],
            "action_size": self.action_size,
            "dist_size": self.dist_size,
            "record_bytes": self.record_bytes,
        }
        return {**d, "state_size": self.state_size} if self.state_size else d

    @classmethod
    def from_json(cls, spec: object) -> StepLayout:
        """Inverse of ``to_json``.  Strict (dtypes in canonical form, no unknown keys, ints not
        bools): ValueError on anything malformed or if ``record_bytes`` (optional) disagrees."""
        if not isinstance(spec, dict):
            raise ValueError(f"step layout must be a JSON object, got {type(spec).__name__}")
        unknown = set(spec) - {"obs_fields", "action_size", "dist_size", "record_bytes", "state_size"}
        missing = {"obs_fields", "action_size", "dist_size"} - set(spec)
        if unknown or missing:
            raise ValueError(f"step layout keys: unknown {sorted(unknown)}, missing {sorted(missing)}")
        layout = cls(_fields_from_json(spec["obs_fields"]), spec["action_size"], spec["dist_size"],
                     spec.get("state_size", 0))
        if "record_bytes" in spec and spec["record_bytes"] != layout.record_bytes:
            raise ValueError(f"record_bytes {spec['record_bytes']!r} does not match the fields in {spec} "
                             f"({layout.record_bytes})")
        return layout

    def sizes(self) -> tuple[tuple[ObsField, ...], int, int, int]:
        """The constructor arguments: ``StepLayout(*layout.sizes()) == layout``; picklable
        plain data (what a ``Topology`` carries across processes)."""
        return (self.obs_fields, self.action_size, self.dist_size, self.state_size)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StepLayout) and self.sizes() == other.sizes()

    def __hash__(self) -> int:
        return hash(self.sizes())

    def __reduce__(self):
        return (StepLayout, self.sizes())

    def __repr__(self) -> str:
        state = f", state_size={self.state_size}" if self.state_size else ""
        return (f"StepLayout({self.obs_fields!r}, action_size={self.action_size}, "
                f"dist_size={self.dist_size}{state})")


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _align(offset: int, alignment: int) -> int:
    return -(-offset // alignment) * alignment


def _pad(n: int) -> str:
    return f"{n}x" if n else ""


def _field_bytes(dtype: str, shape: tuple[int, ...]) -> int:
    return np.dtype(dtype).itemsize * math.prod(shape)


def _field_offsets(fields: tuple[ObsField, ...], start: int) -> tuple[tuple[int, ...], int]:
    """(offset of each field, end of the last) with each field aligned to its itemsize."""
    offsets, pos = [], start
    for _, dtype, shape in fields:
        pos = _align(pos, np.dtype(dtype).itemsize)
        offsets.append(pos)
        pos += _field_bytes(dtype, shape)
    return tuple(offsets), pos


def _check_fields(fields) -> tuple[ObsField, ...]:
    """Normalised obs fields (canonical dtype str, int tuple shapes); ValueError naming the bad one."""
    if not isinstance(fields, (tuple, list)) or not 1 <= len(fields) <= MAX_OBS_FIELDS:
        raise ValueError(f"obs_fields must be a sequence of 1..{MAX_OBS_FIELDS} (name, dtype, shape), "
                         f"got {fields!r:.200}")
    out = tuple(_check_field(field) for field in fields)
    names = [name for name, _, _ in out]
    if len(set(names)) != len(names):
        raise ValueError(f"obs field names are not unique: {names}")
    return out


def _check_field(field) -> ObsField:
    if not isinstance(field, (tuple, list)) or len(field) != 3:
        raise ValueError(f"an obs field is (name, dtype, shape), got {field!r:.200}")
    name, dtype, shape = field
    if (not isinstance(name, str) or not 1 <= len(name) <= MAX_FIELD_NAME_CHARS
            or not all("!" <= c <= "~" for c in name)):
        raise ValueError(f"obs field name must be 1..{MAX_FIELD_NAME_CHARS} printable ASCII characters "
                         f"without spaces, got {name!r:.100}")
    if not isinstance(shape, (tuple, list)) or len(shape) > MAX_FIELD_NDIM or not all(
            _is_int(d) and d >= 1 for d in shape):
        raise ValueError(f"obs field {name!r}: shape must be up to {MAX_FIELD_NDIM} ints >= 1, got {shape!r:.100}")
    return name, _canonical_dtype(name, dtype), tuple(int(d) for d in shape)


def _canonical_dtype(name: str, dtype) -> str:
    try:
        canonical = np.dtype(dtype).str
    except (TypeError, ValueError):
        canonical = None
    if canonical not in FIELD_DTYPES:
        raise ValueError(f"obs field {name!r}: dtype {dtype!r:.40} is not one of {sorted(FIELD_DTYPES)}")
    return canonical


def _fields_from_json(fields: object) -> list:
    """JSON [[name, dtype, [dims]], ...] -> constructor input; only canonical dtype strings pass."""
    if not isinstance(fields, list):
        raise ValueError(f"obs_fields must be a JSON array, got {type(fields).__name__}")
    for field in fields:
        if not (isinstance(field, list) and len(field) == 3 and isinstance(field[2], list)
                and isinstance(field[1], str) and field[1] in FIELD_DTYPES):
            raise ValueError(f"an obs field is [name, dtype in {sorted(FIELD_DTYPES)}, [dims]], "
                             f"got {field!r:.200}")
    return fields


def _obs_mapping(fields: tuple[ObsField, ...], obs) -> Mapping:
    if isinstance(obs, Mapping):
        expected = {name for name, _, _ in fields}
        if set(obs) != expected:
            raise ValueError(f"obs keys {sorted(map(str, obs))} do not match the step layout's "
                             f"{sorted(expected)}")
        return obs
    if len(fields) != 1:
        raise ValueError(f"obs must be a mapping of {[name for name, _, _ in fields]} "
                         f"(the step layout has {len(fields)} fields), got {type(obs).__name__}")
    return {fields[0][0]: obs}


def _check_castable(name: str, src: np.ndarray, dtype: np.dtype) -> None:
    """Refuse lossy kind changes: floats (or non-numbers) into integer/bool fields, integers
    outside the field's range.  Same dtype (e.g. uint8 into uint8) is a plain byte copy."""
    if src.dtype == dtype:
        return
    if dtype.kind == "f":
        if src.dtype.kind not in "biuf":
            raise ValueError(f"obs[{name!r}]: {src.dtype} values do not fit a {dtype} field")
        return
    if src.dtype.kind not in "biu":
        raise ValueError(f"obs[{name!r}]: {src.dtype} values do not fit a {dtype} field (integers expected)")
    low, high = (0, 1) if dtype.kind == "b" else (np.iinfo(dtype).min, np.iinfo(dtype).max)
    if src.size and (int(src.min()) < low or int(src.max()) > high):
        raise ValueError(f"obs[{name!r}]: values outside [{low}, {high}] do not fit a {dtype} field")


class DerivedLayout:
    """Base of the per-policy layouts derived from a ``StepLayout`` (``shm.lanes``,
    ``shm.replay``): their JSON form is {SIZE_KEY: bytes per record, "step_layout": ...},
    checked on the way in; equality is equality of that form."""

    SIZE_KEY = ""
    KIND = ""

    def __init__(self, step: StepLayout) -> None:
        self.step = step
        self.action_size = step.action_size
        self.record_bytes = 0  # set by the subclass

    def to_json(self) -> dict:
        return {self.SIZE_KEY: self.record_bytes, "step_layout": self.step.to_json()}

    @classmethod
    def from_json(cls, spec: object):
        if not isinstance(spec, dict) or "step_layout" not in spec:
            raise LayoutError(f"bad {cls.KIND} layout description {str(spec)[:80]!r}")
        layout = cls(StepLayout.from_json(spec["step_layout"]))
        if spec.get(cls.SIZE_KEY) != layout.record_bytes:
            raise LayoutError(f"{cls.KIND} layout says {spec.get(cls.SIZE_KEY)!r} bytes a record, "
                              f"its fields make {layout.record_bytes}")
        return layout

    def description(self) -> bytes:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode("ascii")

    @classmethod
    def read(cls, path: str, buf, header_bytes: int, layout_bytes: int, record_bytes: int,
             expected: DerivedLayout | None):
        """The layout described at ``header_bytes`` of a mapped segment (``attach`` checks):
        the description fits and parses, its record size is the header's ``record_bytes``
        and, given ``expected``, it is that layout. LayoutError naming ``path`` otherwise."""
        if not 0 < layout_bytes <= len(buf) - header_bytes:
            raise LayoutError(f"{path}: layout description of {layout_bytes} bytes does not fit")
        try:
            spec = json.loads(bytes(buf[header_bytes:header_bytes + layout_bytes]))
        except ValueError as exc:
            raise LayoutError(f"{path}: unreadable {cls.KIND} layout ({exc})") from exc
        layout = cls.from_json(spec)
        if record_bytes != layout.record_bytes:
            raise LayoutError(f"{path}: header says {record_bytes} bytes a record, its layout "
                              f"{layout.record_bytes}")
        if expected is not None and layout != expected:
            raise LayoutError(f"{path}: {cls.KIND} layout {spec} is not the expected {expected.to_json()}")
        return layout

    def __eq__(self, other: object) -> bool:
        return isinstance(other, type(self)) and other.to_json() == self.to_json()

    def __hash__(self) -> int:
        return hash(self.description())


def align(n: int, to: int) -> int:
    """``n`` rounded up to a multiple of ``to``."""
    return (n + to - 1) // to * to
