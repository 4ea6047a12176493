"""Shared-memory building blocks of rlinkd (numpy + stdlib only).

Never imports torch, the daemon or client_lib: clients import this package
too.  Linux x86-64 only (see ``shm._sync`` for the memory-ordering argument).
"""

from rlinkd.shm.blob import BlobArea
from rlinkd.shm.board import WeightsBoard
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.errors import ChecksumError, LayoutError, PayloadTooLarge, RingFull, SegmentOwnerError, ShmError
from rlinkd.shm.records import FINAL_OBS, FLUSH, HAS_DIST, HAS_LOGP, STREAM_END, TERMINATED, TRUNCATED, StepLayout
from rlinkd.shm.ring import StepRing, arm_sleep, disarm_sleep
from rlinkd.shm.segment import DEFAULT_DIRECTORY, Segment, segment_name, sweep_stale
from rlinkd.shm.slots import FILLING, FREE, READY, TRAINING, BatchSlots

__all__ = [
    "DEFAULT_DIRECTORY",
    "FILLING",
    "FINAL_OBS",
    "FLUSH",
    "FREE",
    "HAS_DIST",
    "HAS_LOGP",
    "READY",
    "STREAM_END",
    "TERMINATED",
    "TRAINING",
    "TRUNCATED",
    "BatchSlots",
    "BlobArea",
    "ChecksumError",
    "Doorbell",
    "LayoutError",
    "PayloadTooLarge",
    "RingFull",
    "Segment",
    "SegmentOwnerError",
    "ShmError",
    "StepLayout",
    "StepRing",
    "WeightsBoard",
    "arm_sleep",
    "disarm_sleep",
    "segment_name",
    "sweep_stale",
]
