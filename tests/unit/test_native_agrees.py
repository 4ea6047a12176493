"""direct.c's reply text and plain-step grammar against the Python codec (native_agrees.py):
the built extension agrees, and a native object whose format or grammar drifted is caught
and refused with a logged reason (the role then serves every direct message in Python)."""
from __future__ import annotations

import json
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol import serving as s
from rlinkd.client_lib.protocol.spaces import Box, Discrete
from rlinkd.daemon.inference import fastpath
from rlinkd.daemon.inference.native_agrees import NOT_PLAIN, _plain_fields, disagreement
from rlinkd.daemon.inference.netnative import native_module
from rlinkd.daemon.inference.front import LanePool
from rlinkd.shm.lanes import LaneArea, LaneLayout
from rlinkd.shm.records import StepLayout

needs_native = pytest.mark.skipif(getattr(native_module(), "DirectNative", None) is None,
                                  reason="the _native extension is not built")


class Drifted:
    """A real DirectNative with one of its outputs changed."""

    def __init__(self, real, reply=None, parse=None) -> None:
        self.real, self.reply, self.parse_change = real, reply, parse

    def format_reply(self, *args):
        frame = self.real.format_reply(*args)
        return self.reply(frame) if self.reply else frame

    def parse(self, body):
        got = self.real.parse(body)
        return self.parse_change(body, got) if self.parse_change else got


def real():
    return native_module().DirectNative(1 << 16)


@needs_native
def test_the_built_extension_agrees_with_the_codec():
    assert disagreement(real()) is None


@needs_native
@pytest.mark.parametrize("change", [
    lambda f: f.replace(b'"action":', b'"actoin":'),                  # a key misspelt
    lambda f: f.replace(b'"weights_seq_no":', b'"weights_seq_no":-'),  # a value changed (and its length)
    lambda f: f[:8] + f[8:].replace(b"[", b" ").replace(b"]", b" "),  # no lists, the same length
    lambda f: f.replace(b'"ACTIONS"', b'"ACTION"'),                   # the wrong type
    lambda f: f.replace(b':', b': '),                                 # valid JSON, the header stale
], ids=["key", "value", "shape", "type", "header"])
def test_a_reply_format_that_drifted_is_caught(change):
    reason = disagreement(Drifted(real(), reply=change))
    assert reason is not None and reason.startswith("reply")


@needs_native
def test_a_grammar_that_reads_a_number_otherwise_or_takes_an_end_is_caught():
    off_by_a_bit = Drifted(real(), parse=lambda _b, got: got and (got[0], got[1], got[2] + 1e-9, got[3]))
    assert "plain step" in disagreement(off_by_a_bit)
    takes_an_end = Drifted(real(), parse=lambda b, got: (False, b"ep-1", 1.0, ()) if b == NOT_PLAIN[0] else got)
    assert "is not a plain step" in disagreement(takes_an_end)


def test_a_build_without_the_checks_is_refused():
    assert "rebuild" in disagreement(object())


@needs_native
def test_a_disagreeing_extension_leaves_direct_connections_to_python(tmp_path, monkeypatch):
    area = LaneArea.create(str(tmp_path / "lanes"), LaneLayout(StepLayout.flat(4, 1, 2)), 2)
    pools = {"default": LanePool(area, Box((4,), low=-5.0, high=5.0), Discrete(2), "default")}
    try:
        assert fastpath.FastPath.maybe(pools, 1 << 16) is not None
        broken = types.SimpleNamespace(
            DirectNative=lambda n: Drifted(native_module().DirectNative(n),
                                           reply=lambda f: f.replace(b'"episode_id"', b'"id"')))
        monkeypatch.setattr(fastpath, "native_module", lambda: broken)
        with capture_logs() as logs:
            assert fastpath.FastPath.maybe(pools, 1 << 16) is None
        assert [e["part"] for e in logs if e["event"] == "inference_native_refused"] == ["direct"]
    finally:
        area.close()


@needs_native
@settings(max_examples=300, deadline=None)
@given(body=st.one_of(st.binary(max_size=200), st.builds(
    lambda eid, reward, obs, batch, sep: (
        ('{"type":"STEP_BATCH","steps":[{"episode_id":%s,"reward":%s,"observation":[%s]}]}' if batch else
         '{"type":"STEP","episode_id":%s,"reward":%s,"observation":[%s]}')
        % (json.dumps(eid), repr(reward), sep.join(repr(x) for x in obs))).encode(),
    st.text(min_size=0, max_size=70), st.floats(allow_nan=False, allow_infinity=False),
    st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=0, max_size=18),
    st.booleans(), st.sampled_from([",", ", ", " ,\n"]))))
def test_what_the_native_grammar_takes_the_codec_reads_the_same(body):
    """Any bytes: a body the native grammar takes as a plain step decodes (codec) to a STEP or
    a one-entry STEP_BATCH with the same id, reward and observation."""
    got = real().parse(body)
    if got is None:
        return
    msg = codec.decode_body(body)
    assert _plain_fields(msg) == got
    assert isinstance(msg, (s.Step, s.StepBatch)) and not getattr(msg, "terminated", False)
