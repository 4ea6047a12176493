"""SET_STATE replies built from the weights board, once per ``weights_seq_no``.

The learner publishes flat float32 weights to the shared-memory weights board;
the collector turns them into an ONNX model by replacing only the initializers of
a graph built once (``client_lib.protocol.policy_spec.OnnxWeightWriter``), gzips and
base64-encodes it, and caches the whole encoded SET_STATE frame. Every client
asking for that version gets the same bytes object: a reply costs one socket
write, not an export.
"""
from __future__ import annotations

import base64
import dataclasses
import gzip
import hashlib

import numpy as np

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol.agents import DEFAULT_POLICY
from rlinkd.client_lib.protocol.policy_spec import OnnxWeightWriter, PolicySpec
from rlinkd.shm.board import WeightsBoard

GZIP_LEVEL = 1  # float weights barely compress (~7%); higher levels cost time for <1% size


def set_state_payload(onnx_bytes: bytes) -> str:
    """base64(gzip(onnx)) as RLlib's JSON-era client decodes it."""
    return base64.b64encode(gzip.compress(onnx_bytes, compresslevel=GZIP_LEVEL, mtime=0)).decode("ascii")


class WeightsCache:
    """One policy's newest SET_STATE: the message and its encoded frame. ``refresh`` is
    cheap when nothing changed (one shm read)."""

    def __init__(self, board: WeightsBoard, spec: PolicySpec, name: str = DEFAULT_POLICY) -> None:
        self.board, self.name, self.spec = board, name, spec
        self.writer = OnnxWeightWriter(spec)
        self.seq_no = -1
        self.message: codec.SetState | None = None
        self.frame: bytes | None = None
        self.exploration: dict | None = None  # DQN: {"epsilon": e}, from the learner's reports
        self._flat = np.empty(spec.n_params(), np.float32)

    def refresh(self) -> bool:
        """Re-encode if the board holds a newer version; True when the frame changed."""
        if self.board.latest_seq_no() == self.seq_no:
            return False
        seq, flat = self.board.read(self._flat)
        self._set(seq, self.writer.encode(flat))
        return True

    def set_exploration(self, epsilon: float | None) -> None:
        """The epsilon clients of this (DQN) policy apply, sent with its SET_STATE from now on."""
        exploration = None if epsilon is None else {"epsilon": round(epsilon, 6)}
        if exploration != self.exploration and self.message is not None:
            self.exploration = exploration
            self.message = dataclasses.replace(self.message, exploration={self.name: exploration}
                                               if exploration else None)
            self.frame = codec.encode(self.message)
        self.exploration = exploration

    def _set(self, seq: int, onnx_bytes: bytes) -> None:
        self.message = codec.SetState(weights_seq_no=seq, onnx_file=set_state_payload(onnx_bytes),
                                      onnx_sha256=hashlib.sha256(onnx_bytes).hexdigest(),
                                      exploration={self.name: self.exploration} if self.exploration else None)
        self.frame, self.seq_no = codec.encode(self.message), seq

    @property
    def ready(self) -> bool:
        return self.frame is not None

    @property
    def flat(self) -> np.ndarray:
        """The flat float32 weights of version ``seq_no`` (overwritten by the next refresh)."""
        return self._flat


class StaticWeights(WeightsCache):
    """A frozen policy trained elsewhere: its ONNX file, served as version 0, forever."""

    def __init__(self, board: WeightsBoard, onnx_bytes: bytes, name: str = DEFAULT_POLICY) -> None:
        self.board, self.name = board, name
        self.exploration = None
        self._set(0, onnx_bytes)

    def refresh(self) -> bool:
        return False


def set_state_frame(caches: dict[str, WeightsCache], held: dict[str, int] | None) -> bytes:
    """The SET_STATE for a client: the default policy's keys at the top level (a single-policy
    daemon sends that cached frame as is) and, with several policies, ``policies`` carrying
    every other one — without its model when ``held`` says the client has that version."""
    default = caches[DEFAULT_POLICY]
    assert default.frame is not None and default.message is not None, "refresh before serving"
    if len(caches) == 1:
        return default.frame
    others = {}
    exploration = exploration_of(caches)
    for name, cache in caches.items():
        if name == DEFAULT_POLICY or cache.message is None:
            continue
        entry: dict[str, object] = {"weights_seq_no": cache.seq_no}
        if (held or {}).get(name) != cache.seq_no:
            entry |= {"onnx_file": cache.message.onnx_file, "onnx_sha256": cache.message.onnx_sha256}
        others[name] = entry
    return codec.encode(dataclasses.replace(default.message, policies=others,
                                            exploration=exploration or None))


def exploration_of(caches: dict[str, WeightsCache]) -> dict:
    """Every DQN policy's exploration (the SET_STATE / WEIGHTS_READY extension key)."""
    return {name: c.exploration for name, c in caches.items() if c.exploration}
