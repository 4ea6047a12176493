"""The step-record contract shared by the daemon and its clients.

One fixed-size little-endian record per environment step (plus marker
records).  O, A and D are the obs, action and dist-input float counts::

    offset      size   field           type
    0           1      flags           u8   bit0 TERMINATED, bit1 TRUNCATED,
                                            bit2 FINAL_OBS (only the last obs of a
                                            fragment: ends the fragment),
                                            bit3 FLUSH (marker, no step data),
                                            bit4 HAS_LOGP, bit5 HAS_DIST,
                                            bit6 STREAM_END (marker: the stream's
                                            client went away)
    1           3      (pad)
    4           4      stream_id       u32  producer writes 0; the daemon fills it
    8           8      weights_seq_no  i64  policy version that chose the action, -1 unknown
    16          8      ingest_id       u64  producer writes 0; the daemon fills it
    24          4      reward          f32
    28          4      action_logp     f32
    32          4*O    obs             f32[O]
    32+4O       4*A    action          f32[A]  (Discrete action: one float holding the index)
    32+4(O+A)   4*D    dist_inputs     f32[D]
    32+4(O+A+D)        pad to a multiple of 8 bytes

The numpy ``dtype`` (batch path) and the ``struct`` (single-step path) of a
``StepLayout`` describe exactly this diagram; tests check they agree.
"""

from __future__ import annotations

import struct

import numpy as np

TERMINATED = 1 << 0
TRUNCATED = 1 << 1
FINAL_OBS = 1 << 2
FLUSH = 1 << 3
HAS_LOGP = 1 << 4
HAS_DIST = 1 << 5
STREAM_END = 1 << 6
"""Marker (daemon-internal): the stream's client went away; no step data."""

STEP_HEADER_BYTES = 32
"""Bytes before the obs floats (flags .. action_logp)."""

_HEADER_FIELDS = (
    ("flags", "u1", 0),
    ("stream_id", "<u4", 4),
    ("weights_seq_no", "<i8", 8),
    ("ingest_id", "<u8", 16),
    ("reward", "<f4", 24),
    ("logp", "<f4", 28),
)


class StepLayout:
    """Byte layout of step records for given obs/action/dist float counts.

    Immutable value object; build once per stream (cheap).  ``obs_size`` and
    ``action_size`` must be >= 1, ``dist_size`` >= 0.
    """

    def __init__(self, obs_size: int, action_size: int, dist_size: int) -> None:
        if obs_size < 1 or action_size < 1 or dist_size < 0:
            raise ValueError(f"bad step layout sizes obs={obs_size} action={action_size} dist={dist_size}")
        self.obs_size = int(obs_size)
        self.action_size = int(action_size)
        self.dist_size = int(dist_size)
        self.obs_offset = STEP_HEADER_BYTES
        self.action_offset = self.obs_offset + 4 * self.obs_size
        self.dist_offset = self.action_offset + 4 * self.action_size
        payload_end = self.dist_offset + 4 * self.dist_size
        self.record_bytes = (payload_end + 7) & ~7
        self.struct = struct.Struct(self._struct_format(payload_end))
        self.dtype = self._numpy_dtype()

    def _struct_format(self, payload_end: int) -> str:
        floats = "".join(f"{n}f" for n in (self.obs_size, self.action_size, self.dist_size) if n)
        padding = self.record_bytes - payload_end
        return "<B3xIqQff" + floats + (f"{padding}x" if padding else "")

    def _numpy_dtype(self) -> np.dtype:
        names = [name for name, _, _ in _HEADER_FIELDS] + ["obs", "action", "dist"]
        formats = [fmt for _, fmt, _ in _HEADER_FIELDS] + [
            ("<f4", (self.obs_size,)),
            ("<f4", (self.action_size,)),
            ("<f4", (self.dist_size,)),
        ]
        offsets = [off for _, _, off in _HEADER_FIELDS] + [self.obs_offset, self.action_offset, self.dist_offset]
        return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": self.record_bytes})

    def empty(self, n_records: int) -> np.ndarray:
        """A zero-filled array of ``n_records`` records (e.g. for ``write_batch``)."""
        return np.zeros(n_records, dtype=self.dtype)

    def to_json(self) -> dict:
        return {
            "obs_size": self.obs_size,
            "action_size": self.action_size,
            "dist_size": self.dist_size,
            "record_bytes": self.record_bytes,
        }

    @classmethod
    def from_json(cls, spec: dict) -> StepLayout:
        """Inverse of ``to_json``; ValueError if ``record_bytes`` disagrees with the sizes."""
        layout = cls(spec["obs_size"], spec["action_size"], spec["dist_size"])
        if "record_bytes" in spec and spec["record_bytes"] != layout.record_bytes:
            raise ValueError(f"record_bytes {spec['record_bytes']} does not match sizes in {spec} "
                             f"({layout.record_bytes})")
        return layout

    def sizes(self) -> tuple[int, int, int]:
        return (self.obs_size, self.action_size, self.dist_size)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StepLayout) and self.sizes() == other.sizes()

    def __hash__(self) -> int:
        return hash(self.sizes())

    def __repr__(self) -> str:
        return f"StepLayout(obs_size={self.obs_size}, action_size={self.action_size}, dist_size={self.dist_size})"
