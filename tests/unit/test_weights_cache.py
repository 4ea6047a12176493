"""The collector's SET_STATE cache: one frame per weights_seq_no, a correct onnx_sha256, a
model that computes what the published weights compute."""
from __future__ import annotations

import base64
import gzip
import hashlib
import os
import shutil
import tempfile

import numpy as np
import pytest

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.policy import BoardPolicy, OnnxPolicy
from rlinkd.daemon.collector.weights import WeightsCache
from rlinkd.daemon.config import load_config
from rlinkd.daemon.wiring import make_policy_spec, resolve_spaces
from rlinkd.shm.board import WeightsBoard


@pytest.fixture
def board_and_spec():
    cfg = load_config(None, [])
    spec = make_policy_spec(cfg, *resolve_spaces(cfg))
    directory = tempfile.mkdtemp(prefix="rlkt-wc-", dir="/dev/shm")
    board = WeightsBoard.create(os.path.join(directory, "board"), spec.n_params(), b"{}")
    yield board, spec
    board.close()
    shutil.rmtree(directory)


def publish_random(board, spec, seq: int, seed: int) -> np.ndarray:
    flat = np.random.default_rng(seed).normal(0, 0.5, spec.n_params()).astype(np.float32)
    board.publish(seq, flat)
    return flat


def test_one_frame_per_version_with_a_true_sha256_and_the_published_weights(board_and_spec):
    board, spec = board_and_spec
    cache = WeightsCache(board, spec)
    assert not cache.ready
    flat = publish_random(board, spec, 1, seed=0)
    assert cache.refresh() is True
    frame = cache.frame
    assert cache.refresh() is False and cache.frame is frame  # same bytes object, no re-encode
    msg = codec.decode_body(frame[codec.HEADER_BYTES:])
    assert isinstance(msg, codec.SetState) and msg.weights_seq_no == 1
    onnx_bytes = gzip.decompress(base64.b64decode(msg.onnx_file))
    assert hashlib.sha256(onnx_bytes).hexdigest() == msg.onnx_sha256
    x = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    reference = BoardPolicy(spec, flat, 1).dist_inputs(x)
    np.testing.assert_allclose(OnnxPolicy(msg).dist_inputs(x), reference, rtol=1e-4, atol=1e-5)

    flat2 = publish_random(board, spec, 2, seed=5)
    assert cache.refresh() is True and cache.frame is not frame
    msg2 = codec.decode_body(cache.frame[codec.HEADER_BYTES:])
    assert msg2.weights_seq_no == 2 and msg2.onnx_sha256 != msg.onnx_sha256
    np.testing.assert_allclose(OnnxPolicy(msg2).dist_inputs(x), BoardPolicy(spec, flat2, 2).dist_inputs(x),
                               rtol=1e-4, atol=1e-5)
