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
import gzip
import hashlib

import numpy as np

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol.policy_spec import OnnxWeightWriter, PolicySpec
from rlinkd.shm.board import WeightsBoard

GZIP_LEVEL = 1  # float weights barely compress (~7%); higher levels cost time for <1% size


def set_state_payload(onnx_bytes: bytes) -> str:
    """base64(gzip(onnx)) as RLlib's JSON-era client decodes it."""
    return base64.b64encode(gzip.compress(onnx_bytes, compresslevel=GZIP_LEVEL, mtime=0)).decode("ascii")


class WeightsCache:
    """Newest SET_STATE frame. ``refresh`` is cheap when nothing changed (one shm read)."""

    def __init__(self, board: WeightsBoard, spec: PolicySpec) -> None:
        self.board = board
        self.writer = OnnxWeightWriter(spec)
        self.seq_no = -1
        self.frame: bytes | None = None
        self._flat = np.empty(spec.n_params(), np.float32)

    def refresh(self) -> bool:
        """Re-encode if the board holds a newer version; True when the frame changed."""
        if self.board.latest_seq_no() == self.seq_no:
            return False
        seq, flat = self.board.read(self._flat)
        onnx_bytes = self.writer.encode(flat)
        msg = codec.SetState(weights_seq_no=seq, onnx_file=set_state_payload(onnx_bytes),
                             onnx_sha256=hashlib.sha256(onnx_bytes).hexdigest())
        self.frame, self.seq_no = codec.encode(msg), seq
        return True

    @property
    def ready(self) -> bool:
        return self.frame is not None
