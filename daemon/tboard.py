"""TensorBoard event files, written by hand (no ``tensorboard``/``tensorboardX`` dependency).

An event file is a TFRecord stream of serialized ``tensorflow.Event`` protobufs.
The first record carries ``file_version = "brain.Event:2"``; each later record is
one scalar batch: ``wall_time``, ``step`` and a ``Summary`` of ``(tag, simple_value)``
pairs. Only the protobuf fields below are written or decoded::

    Event          1 wall_time     double   (wire 1, fixed64)
                   2 step          int64    (wire 0, varint)
                   3 file_version  string   (wire 2, length-delimited)
                   5 summary       Summary  (wire 2)
    Summary        1 value         repeated Summary.Value (wire 2)
    Summary.Value  1 tag           string   (wire 2)
                   2 simple_value  float    (wire 5, fixed32)

Writer side: ``EventWriter`` (the supervisor's). Reader side: ``read_events``, for
tests and debugging; it checks both CRCs of every record.
"""
from __future__ import annotations

import math
import numbers
import operator
import os
import socket
import struct
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

FILE_VERSION = "brain.Event:2"

# One TFRecord (all integers little-endian)::
#
#     offset  size  field
#     0       8     length      u64  len(data)
#     8       4     length_crc  u32  masked_crc(crc32c(bytes 0..7))
#     12      N     data        the serialized Event
#     12+N    4     data_crc    u32  masked_crc(crc32c(data))
_RECORD_HEADER = struct.Struct("<QI")   # length, length_crc
_RECORD_FOOTER = struct.Struct("<I")    # data_crc

_F64 = struct.Struct("<d")   # protobuf double (wire type 1)
_F32 = struct.Struct("<f")   # protobuf float (wire type 5)
_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5   # protobuf wire types
_FIXED_SIZE = {_FIXED64: 8, _FIXED32: 4}
_U64 = 0xFFFF_FFFF_FFFF_FFFF

_CRC32C_POLY = 0x82F63B78   # Castagnoli, reflected
_MASK_DELTA = 0xA282EAD8


# --- CRC-32C ---------------------------------------------------------------------------

def _crc32c_table() -> tuple[int, ...]:
    """256 entries: the reflected CRC of each byte value (standard table-driven CRC)."""
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (_CRC32C_POLY if crc & 1 else 0)
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data`` as an unsigned 32-bit int.

    Pure Python, one table lookup per byte (a few MB/s): fine for a few small records
    per second. ``crc32c(b"123456789") == 0xE3069283``, ``crc32c(b"") == 0``.
    """
    crc = 0xFFFFFFFF
    table = _CRC32C_TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(crc: int) -> int:
    """TFRecord's masked CRC: rotate right by 15 bits, add 0xA282EAD8, mod 2**32."""
    crc &= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """One TFRecord around ``data``: header (length, its masked CRC), data, masked CRC."""
    length = len(data).to_bytes(8, "little")
    header = _RECORD_HEADER.pack(len(data), masked_crc(crc32c(length)))
    return header + data + _RECORD_FOOTER.pack(masked_crc(crc32c(data)))


# --- protobuf encoding ---------------------------------------------------------------------

def _varint(value: int) -> bytes:
    """Base-128 varint, low groups first; negatives as 64-bit two's complement (10 bytes)."""
    value &= _U64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _len_field(field: int, payload: bytes) -> bytes:
    return _key(field, _LEN) + _varint(len(payload)) + payload


def _f32(value: float) -> bytes:
    """float32 bytes; magnitudes beyond float32 range saturate to +-inf."""
    try:
        return _F32.pack(value)
    except OverflowError:
        return _F32.pack(math.inf if value > 0 else -math.inf)


def _summary_value(tag: str, value: float) -> bytes:
    return _len_field(1, tag.encode()) + _key(2, _FIXED32) + _f32(value)


def encode_event(wall_time: float, *, step: int | None = None, file_version: str | None = None,
                 scalars: Mapping[str, float] | None = None) -> bytes:
    """A serialized ``Event``: fields in number order, each only when given.

    ``scalars`` become one ``Summary`` with a ``Summary.Value`` per item, in order,
    rounded to float32. The caller filters values (``EventWriter.add_scalars`` does).
    """
    out = _key(1, _FIXED64) + _F64.pack(wall_time)
    if step is not None:
        out += _key(2, _VARINT) + _varint(operator.index(step))
    if file_version is not None:
        out += _len_field(3, file_version.encode())
    if scalars is not None:
        summary = b"".join(_len_field(1, _summary_value(t, v)) for t, v in scalars.items())
        out += _len_field(5, summary)
    return out


# --- writer --------------------------------------------------------------------------------

def _usable(value: object) -> float | None:
    """``value`` as a float, or None for None/NaN/non-real (str, complex, arrays...)."""
    if not isinstance(value, numbers.Real):
        return None
    try:
        value = float(value)
    except OverflowError:   # an int beyond double range
        return -math.inf if value < 0 else math.inf
    return None if math.isnan(value) else value


class EventWriter:
    """Appends scalar events to one new TensorBoard event file in ``directory``.

    Caller: the supervisor, once per status interval (``add_scalars`` then ``flush``),
    from one thread; ``close`` at shutdown. The file is
    ``events.out.tfevents.<int(time)>.<hostname>.<pid>.rlinkd``; the directory is
    created (mode 0o700) with its parents, the file with mode 0o600 and opened for
    append, so a writer re-created by the same process within the same second
    continues the same file (still a valid stream). The ``file_version`` record is
    written and flushed by the constructor.

    I/O errors: every method raises ``OSError`` (ENOSPC, EIO, a missing or
    unwritable directory...) to the caller, which logs it and disables TensorBoard
    output: it should ``close`` the writer (that may raise ``OSError`` again) and
    drop it. A failed write may leave a torn last record, which readers (TensorBoard
    and ``read_events``) report as truncation. Use after ``close`` raises ValueError.
    """

    def __init__(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.rlinkd"
        self.path = directory / name
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        file = os.fdopen(os.open(self.path, flags, 0o600), "ab")
        self._file: BinaryIO | None = file
        try:
            self._write(encode_event(time.time(), file_version=FILE_VERSION))
            self.flush()
        except OSError:
            file.close()
            raise

    @property
    def closed(self) -> bool:
        return self._file is None

    def add_scalars(self, step: int, scalars: Mapping[str, float],
                    wall_time: float | None = None) -> None:
        """Buffer one Event at ``step`` holding every usable value of ``scalars``.

        None, NaN and non-real values are skipped (+-inf is kept); if nothing is left,
        nothing is written. Values are stored as float32. ``wall_time`` defaults to
        now. Data reaches the file on ``flush``/``close`` (or when the buffer fills).
        """
        kept = {tag: v for tag, v in ((t, _usable(x)) for t, x in scalars.items()) if v is not None}
        if kept:
            wall = time.time() if wall_time is None else float(wall_time)
            self._write(encode_event(wall, step=step, scalars=kept))

    def flush(self) -> None:
        """Hand buffered records to the kernel (no fsync)."""
        self._open_file().flush()

    def close(self) -> None:
        """Flush and close; idempotent. The file is closed even if the flush raises."""
        file, self._file = self._file, None
        if file is not None:
            file.close()

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _open_file(self) -> BinaryIO:
        if self._file is None:
            raise ValueError(f"EventWriter for {self.path} is closed")
        return self._file

    def _write(self, event: bytes) -> None:
        self._open_file().write(frame_record(event))


# --- reader ----------------------------------------------------------------------------------

def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it); ValueError when truncated or longer than 10 bytes."""
    result = shift = 0
    while pos < len(buf) and shift < 64:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    raise ValueError("truncated or overlong protobuf varint")


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) per field: varints as int, the others as bytes
    (the wire type says which, so the value is typed Any)."""
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        value: int | bytes
        if wire == _VARINT:
            value, pos = _read_varint(buf, pos)
        else:
            if wire == _LEN:
                size, pos = _read_varint(buf, pos)
            elif wire in _FIXED_SIZE:
                size = _FIXED_SIZE[wire]
            else:
                raise ValueError(f"unsupported protobuf wire type {wire} (field {field})")
            if pos + size > len(buf):
                raise ValueError(f"truncated protobuf field {field}")
            value, pos = buf[pos:pos + size], pos + size
        yield field, wire, value


def _decode_summary(buf: bytes) -> dict[str, float]:
    """{tag: simple_value} of a Summary; values of other kinds are ignored."""
    scalars = {}
    for field, wire, value in _fields(buf):
        if (field, wire) != (1, _LEN):
            continue
        parts = {(f, w): v for f, w, v in _fields(value)}
        if (1, _LEN) in parts and (2, _FIXED32) in parts:
            scalars[parts[1, _LEN].decode()] = _F32.unpack(parts[2, _FIXED32])[0]
    return scalars


def decode_event(data: bytes) -> dict:
    """``{"wall_time", "step"}`` plus ``"file_version"`` and/or ``"scalars"`` when present.

    Absent wall_time/step read as 0 (protobuf defaults); unknown fields are skipped.
    """
    event: dict = {"wall_time": 0.0, "step": 0}
    for field, wire, value in _fields(data):
        if (field, wire) == (1, _FIXED64):
            event["wall_time"] = _F64.unpack(value)[0]
        elif (field, wire) == (2, _VARINT):
            event["step"] = value - (1 << 64) if value >> 63 else value
        elif (field, wire) == (3, _LEN):
            event["file_version"] = value.decode()
        elif (field, wire) == (5, _LEN):
            event.setdefault("scalars", {}).update(_decode_summary(value))
    return event


def _records(data: bytes) -> Iterator[bytes]:
    """The payload of each TFRecord in ``data``; ValueError on a bad CRC or truncation."""
    pos = 0
    while pos < len(data):
        if pos + _RECORD_HEADER.size > len(data):
            raise ValueError(f"truncated record header at offset {pos}")
        length, length_crc = _RECORD_HEADER.unpack_from(data, pos)
        if masked_crc(crc32c(data[pos:pos + 8])) != length_crc:
            raise ValueError(f"length CRC mismatch in record at offset {pos}")
        start = pos + _RECORD_HEADER.size
        end = start + length
        if end + _RECORD_FOOTER.size > len(data):
            raise ValueError(f"truncated record at offset {pos}")
        (data_crc,) = _RECORD_FOOTER.unpack_from(data, end)
        if masked_crc(crc32c(data[start:end])) != data_crc:
            raise ValueError(f"data CRC mismatch in record at offset {pos}")
        yield data[start:end]
        pos = end + _RECORD_FOOTER.size


def read_events(path: str | Path) -> list[dict]:
    """Every Event in the file at ``path``, in order, decoded by ``decode_event``.

    Raises ValueError when a record's length or data CRC does not match, the file
    ends mid-record, or a record is not a well-formed protobuf; OSError when unreadable.
    """
    return [decode_event(record) for record in _records(Path(path).read_bytes())]
