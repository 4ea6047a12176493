"""client_lib.protocol.codec: framing, every message type, and every decode error (tier 1, pure)."""
from __future__ import annotations

import dataclasses
import random

import numpy as np
import orjson

from rlinkd.client_lib.protocol.fragments import from_wire
from rlinkd.client_lib.protocol.spaces import Box, Discrete, InvalidValue
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol.codec import (BadHeader, BadMessage, EpisodeFragment, FrameDecoder,
                              FrameTooLarge, MessageType, ProtocolError)

MAX = 1 << 20


def frag(t: int = 2, obs_dim: int = 2, **kw) -> EpisodeFragment:
    """A well-formed fragment of ``t`` steps with distinct values everywhere."""
    base = dict(obs=np.arange((t + 1) * obs_dim, dtype=np.float64).reshape(t + 1, obs_dim) / 10,
                actions=np.arange(t, dtype=np.float64) % 2, rewards=np.linspace(0.5, 1.5, t),
                is_terminated=False, is_truncated=False)
    base.update(kw)
    return EpisodeFragment(**base)


def episodes_body(**fragment_overrides) -> dict:
    """A valid EPISODES body (one 2-step fragment) with fragment keys overridden/removed."""
    f = {"obs": [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]], "actions": [0, 1], "rewards": [1.0, 0.5],
         "is_terminated": False, "is_truncated": False}
    for key, value in fragment_overrides.items():
        if value is _DELETE:
            del f[key]
        else:
            f[key] = value
    return {"type": "EPISODES", "episodes": [f], "env_steps": 2}


_DELETE = object()


def dumps(obj) -> bytes:
    return orjson.dumps(obj)


def assert_fragments_equal(a: EpisodeFragment, b: EpisodeFragment) -> None:
    for name in ("obs", "actions", "rewards", "action_logp", "action_dist_inputs"):
        x, y = getattr(a, name), getattr(b, name)
        if x is None or y is None:
            assert x is None and y is None, name
        else:
            np.testing.assert_array_equal(np.asarray(x, np.float64), np.asarray(y, np.float64),
                                          err_msg=name)
    assert (a.is_terminated, a.is_truncated) == (b.is_terminated, b.is_truncated)


# ---------------------------------------------------------------- framing
def test_encode_ping_is_exactly_the_seed_example():
    assert codec.encode(codec.Ping()) == b'00000015{"type":"PING"}'
    assert codec.encode_body({"type": "PING"})[:8] == b"00000015"
    # the seed's spaced JSON (16 bytes) decodes to the same message
    dec = FrameDecoder(MAX)
    dec.feed(b'00000016{"type": "PING"}')
    assert dec.next_message() == codec.Ping()
    assert dec.next_body() is None


def test_frame_decoder_returns_none_until_the_frame_is_complete():
    data = codec.encode(codec.Error(message="hello"))
    dec = FrameDecoder(MAX)
    for i in range(len(data) - 1):
        dec.feed(data[i:i + 1])
        assert dec.next_body() is None
    dec.feed(data[-1:])
    assert dec.next_message() == codec.Error(message="hello")
    assert dec.next_body() is None


_message_strategy = st.one_of(
    st.builds(codec.Ping, token=st.one_of(st.none(), st.text(max_size=20))),
    st.just(codec.Pong()), st.just(codec.GetConfig()), st.just(codec.GetState()),
    st.builds(codec.SetState, weights_seq_no=st.integers(0, 2**40), onnx_file=st.text(max_size=50),
              onnx_sha256=st.one_of(st.none(), st.text(max_size=64))),
    st.builds(codec.Error, message=st.text(max_size=200)),
    st.builds(codec.SetConfig, env_steps_per_sample=st.integers(1, 10**6),
              force_on_policy=st.booleans()),
)


@settings(max_examples=60, deadline=None)
@given(msgs=st.lists(_message_strategy, min_size=1, max_size=8), seed=st.integers(0, 2**32 - 1),
       max_chunk=st.integers(1, 64))
def test_frames_survive_random_chunking(msgs, seed, max_chunk):
    stream = b"".join(codec.encode(m) for m in msgs)
    rng = random.Random(seed)
    dec = FrameDecoder(MAX)
    out, pos = [], 0
    while pos < len(stream):
        n = rng.randint(1, max_chunk)
        dec.feed(stream[pos:pos + n])
        pos += n
        while (m := dec.next_message()) is not None:
            out.append(m)
    assert out == msgs
    assert dec.next_body() is None


# ---------------------------------------------------------------- parse_header
@pytest.mark.parametrize("header", [b"0000001a", b" 0000016", b"+0000016", b"-0000016",
                                    b"0000016\n", b"\x00" * 8, b"00000016"[:7], b"000000016",
                                    "٠٠٠٠٠٠١٦".encode()[:8], b"1.000000"])
def test_parse_header_refuses_non_digit_headers(header):
    with pytest.raises(BadHeader):
        codec.parse_header(header, MAX)


def test_parse_header_limits():
    assert codec.parse_header(b"00000000", 10) == 0
    assert codec.parse_header(b"00000010", 10) == 10
    with pytest.raises(FrameTooLarge, match="max_message_bytes=10"):
        codec.parse_header(b"00000011", 10)
    with pytest.raises(FrameTooLarge):
        codec.parse_header(b"99999999", MAX)


def test_decoder_refuses_oversize_header_before_any_body_byte():
    dec = FrameDecoder(1024)
    dec.feed(b"00002000")  # header only: the body has not arrived, must already fail
    with pytest.raises(FrameTooLarge):
        dec.next_body()


def test_decoder_refuses_bad_header_immediately():
    dec = FrameDecoder(MAX)
    dec.feed(b"GET / HTTP/1.1\r\n")
    with pytest.raises(BadHeader):
        dec.next_body()


def test_encode_refuses_a_body_larger_than_eight_digits(monkeypatch):
    monkeypatch.setattr(codec, "MAX_ENCODABLE_BYTES", 20)
    with pytest.raises(ProtocolError, match="8-digit"):
        codec.encode(codec.Error(message="x" * 30))


# ---------------------------------------------------------------- round trips
SIMPLE_MESSAGES = [
    codec.Ping(), codec.Ping(token="s3cret"), codec.Pong(), codec.GetConfig(), codec.GetState(),
    codec.SetConfig(env_steps_per_sample=500, force_on_policy=True),
    codec.SetConfig(env_steps_per_sample=7, force_on_policy=False,
                    observation_space={"type": "Box", "shape": [4], "low": [None] * 4,
                                       "high": [1.0] * 4},
                    action_space={"type": "Discrete", "n": 2}, protocol_version=1),
    codec.SetState(weights_seq_no=123, onnx_file="b64=="),
    codec.SetState(weights_seq_no=0, onnx_file="", onnx_sha256="ab" * 32),
    codec.Error(message="something went wrong"),
    codec.Status(), codec.Status(token="t"),
    codec.StatusReport(), codec.StatusReport(status={"env_steps": 5, "nested": {"a": [1, 2]}}),
    codec.Attach(pid=4242), codec.Attach(pid=1, capacity_records=4096, token="t"),
    codec.Attached(ring_name="rlinkd.1.ab.client-1-cd", board_path="/dev/shm/b", doorbell_path="/run/d",
                   layout={"obs_size": 4}, policy_spec={"obs_size": 4}, env_steps_per_sample=64,
                   force_on_policy=True),
    codec.SampleReady(env_steps=64), codec.SampleReady(env_steps=3, get_state=False),
    codec.WeightsReady(weights_seq_no=7),
]


@pytest.mark.parametrize("msg", SIMPLE_MESSAGES, ids=lambda m: type(m).__name__)
def test_simple_message_round_trip(msg):
    data = codec.encode(msg)
    assert codec.parse_header(data[:8], MAX) == len(data) - 8
    decoded = codec.decode_body(data[8:])
    assert type(decoded) is type(msg)
    assert decoded == msg


def test_every_message_type_has_a_round_trip_test():
    from rlinkd.client_lib.protocol.serving import DECODERS as serving  # test_serving_codec
    covered = {m.TYPE for m in SIMPLE_MESSAGES} | {MessageType.EPISODES,
                                                     MessageType.EPISODES_AND_GET_STATE} | set(serving)
    assert covered == set(MessageType)


@pytest.mark.parametrize("cls", [codec.Episodes, codec.EpisodesAndGetState])
def test_episodes_round_trip(cls):
    f1 = frag(3, is_terminated=True, action_logp=np.array([-0.1, -0.2, -0.3]),
              action_dist_inputs=np.array([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]]))
    f2 = frag(1, obs_dim=3, is_truncated=True)
    f3 = frag(0)  # an empty fragment is structurally valid: obs has one row
    msg = cls(episodes=(f1, f2, f3), weights_seq_no=9)
    body = orjson.loads(codec.encode(msg)[8:])
    assert body["type"] == cls.TYPE.value and body["env_steps"] == 4
    decoded = codec.decode_body(codec.encode(msg)[8:])
    assert type(decoded) is cls
    assert decoded.env_steps == 4 and decoded.num_steps == 4 and decoded.weights_seq_no == 9
    assert len(decoded.episodes) == 3
    for a, b in zip(msg.episodes, decoded.episodes):
        assert_fragments_equal(a, b)
        assert b.rewards.dtype == np.float64  # obs/actions stay JSON until the spaces convert them


def test_episodes_round_trip_without_seq_no_and_with_list_fields():
    f = EpisodeFragment(obs=[[1, 2], [3, 4]], actions=[1], rewards=[2.5], is_terminated=False,
                        is_truncated=False)
    decoded = codec.decode_body(codec.encode(codec.Episodes(episodes=(f,)))[8:])
    assert decoded.weights_seq_no is None
    np.testing.assert_array_equal(decoded.episodes[0].obs, [[1.0, 2.0], [3.0, 4.0]])


def test_episodes_encode_non_contiguous_arrays():
    """A fragment built from array views (e.g. a column slice) must encode like a copy."""
    obs = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    f = EpisodeFragment(obs=obs, actions=np.array([0.0, 1.0]), rewards=np.ones(4)[::2],
                        is_terminated=True, is_truncated=False)
    decoded = codec.decode_body(codec.encode(codec.Episodes(episodes=(f,)))[8:])
    np.testing.assert_array_equal(decoded.episodes[0].obs, obs)
    np.testing.assert_array_equal(decoded.episodes[0].rewards, [1.0, 1.0])


def test_rllib_timesteps_key_is_accepted_and_checked():
    body = episodes_body()
    del body["env_steps"]
    body["timesteps"] = 2
    msg = codec.decode_body(dumps(body))
    assert isinstance(msg, codec.Episodes) and msg.env_steps == 2
    body["timesteps"] = 3
    with pytest.raises(BadMessage, match="env_steps/timesteps"):
        codec.decode_body(dumps(body))


def test_env_steps_is_optional():
    body = episodes_body()
    del body["env_steps"]
    assert codec.decode_body(dumps(body)).env_steps == 2


# ---------------------------------------------------------------- decode errors
@pytest.mark.parametrize("body", [b"", b"{", b"not json", b"\xff\xfe{}", b'{"type": "PING"} x',
                                  b"NaN", b'{"type": "PING", "token": Infinity}'])
def test_decode_refuses_non_json(body):
    with pytest.raises(BadMessage, match="not valid UTF-8 JSON"):
        codec.decode_body(body)


@pytest.mark.parametrize("body", [b"[]", b'"PING"', b"16", b"null", b'[{"type": "PING"}]'])
def test_decode_refuses_non_object(body):
    with pytest.raises(BadMessage, match="must be a JSON object"):
        codec.decode_body(body)


@pytest.mark.parametrize("kind", ["NOPE", "ping", None, 1, [1], {"a": 1}, ""])
def test_decode_refuses_unknown_type(kind):
    body = {} if kind is None else {"type": kind}
    with pytest.raises(BadMessage, match="unknown message type"):
        codec.decode_body(dumps(body))


@pytest.mark.parametrize("body, field", [
    ({"type": "SET_CONFIG", "force_on_policy": True}, "env_steps_per_sample"),
    ({"type": "SET_CONFIG", "env_steps_per_sample": 5}, "force_on_policy"),
    ({"type": "SET_CONFIG", "env_steps_per_sample": None, "force_on_policy": True},
     "env_steps_per_sample"),
    ({"type": "SET_STATE", "weights_seq_no": 1}, "onnx_file"),
    ({"type": "ERROR"}, "message"),
    ({"type": "ATTACH"}, "pid"),
    ({"type": "EPISODES"}, "episodes"),
])
def test_decode_refuses_missing_field(body, field):
    with pytest.raises(BadMessage, match=f"missing field '{field}'"):
        codec.decode_body(dumps(body))


@pytest.mark.parametrize("body, field", [
    ({"type": "SET_CONFIG", "env_steps_per_sample": True, "force_on_policy": True},
     "env_steps_per_sample"),                                          # bool is not int
    ({"type": "SET_CONFIG", "env_steps_per_sample": 5.0, "force_on_policy": True},
     "env_steps_per_sample"),                                          # float is not int
    ({"type": "SET_CONFIG", "env_steps_per_sample": "5", "force_on_policy": True},
     "env_steps_per_sample"),                                          # string number
    ({"type": "SET_CONFIG", "env_steps_per_sample": 5, "force_on_policy": 1},
     "force_on_policy"),                                               # int is not bool
    ({"type": "SET_CONFIG", "env_steps_per_sample": 5, "force_on_policy": True,
      "observation_space": [1]}, "observation_space"),
    ({"type": "PING", "token": 5}, "token"),
    ({"type": "PING", "token": ["a"]}, "token"),
    ({"type": "SET_STATE", "weights_seq_no": "1", "onnx_file": "x"}, "weights_seq_no"),
    ({"type": "SET_STATE", "weights_seq_no": 1, "onnx_file": ["x"]}, "onnx_file"),
    ({"type": "EPISODES", "episodes": "abc"}, "episodes"),             # str vs list
    ({"type": "EPISODES", "episodes": {}}, "episodes"),
    ({"type": "EPISODES", "episodes": [], "weights_seq_no": True}, "weights_seq_no"),
    ({"type": "SAMPLE_READY", "env_steps": 3, "get_state": "yes"}, "get_state"),
])
def test_decode_refuses_mistyped_field(body, field):
    with pytest.raises(BadMessage, match=f"field '{field}' must be"):
        codec.decode_body(dumps(body))


@pytest.mark.parametrize("overrides, pattern", [
    ({"rewards": ["1.0", "0.5"]}, r"episodes\[0\]\.rewards must hold only numbers"),
    ({"action_logp": "x"}, r"episodes\[0\]\.action_logp must be a list"),
    ({"action_logp": [-1.0, "x"]}, r"episodes\[0\]\.action_logp must hold only numbers"),
    ({"rewards": [[1.0], [0.5]]}, r"rewards must be a flat list"),
    ({"obs": [[0.0, 1.0], [2.0, 3.0]]}, r"obs has 2 entries, expected len\(rewards\)\+1 = 3"),
    ({"obs": [[0.0, 1.0]] * 4}, r"obs has 4 entries"),
    ({"actions": [0]}, r"actions has 1 entries, rewards 2"),
    ({"actions": [0, 1, 1]}, r"actions has 3 entries"),
    ({"rewards": [1.0]}, r"obs has 3 entries, expected len\(rewards\)\+1 = 2"),
    ({"action_logp": [-0.1]}, r"action_logp has 1 entries, rewards 2"),
    ({"action_dist_inputs": [[0.1, 0.2]] * 3}, r"action_dist_inputs has 3 entries"),
    ({"is_terminated": 1}, r"'is_terminated' must be bool"),
    ({"is_truncated": "false"}, r"'is_truncated' must be bool"),
    ({"obs": _DELETE}, r"missing field 'obs'"),
    ({"rewards": _DELETE}, r"missing field 'rewards'"),
    ({"is_truncated": _DELETE}, r"missing field 'is_truncated'"),
    ({"rewards": 5}, r"'rewards' must be list"),
])
def test_decode_refuses_bad_fragments(overrides, pattern):
    with pytest.raises(BadMessage, match=pattern):
        codec.decode_body(dumps(episodes_body(**overrides)))


@pytest.mark.parametrize("overrides, pattern", [
    ({"obs": [[0.0, 1.0], [2.0], [4.0, 5.0]]}, r"episodes\[0\]\.obs\[1\]: shape \[1\], space wants \[2\]"),
    ({"obs": [[0.0, 1.0], 2.0, [4.0, 5.0]]}, r"episodes\[0\]\.obs\[1\]: shape \[\], space wants \[2\]"),
    ({"actions": [[0], [1, 2]]}, r"episodes\[0\]\.actions"),
    ({"obs": [["0", "1"], ["2", "3"], ["4", "5"]]}, r"episodes\[0\]\.obs: values must be numbers"),
    ({"actions": [0, "1"]}, r"episodes\[0\]\.actions: values must be numbers"),
    ({"obs": [[0, None], [2, 3], [4, 5]]}, r"episodes\[0\]\.obs: values must be numbers"),
    ({"obs": [[0, {}], [2, 3], [4, 5]]}, r"episodes\[0\]\.obs"),
])
def test_ragged_or_non_numeric_obs_and_actions_are_refused_by_the_spaces(overrides, pattern):
    """The codec keeps obs/actions as JSON (their structure depends on the space); the
    conversion against the spaces refuses them, naming the leaf."""
    frag = codec.decode_body(dumps(episodes_body(**overrides))).episodes[0]
    with pytest.raises(InvalidValue, match=pattern):
        from_wire(frag, Box([2]), Discrete(2), "episodes[0]")


def test_terminated_and_truncated_together_is_accepted():
    """gymnasium can report both at once (termination on the time-limit step)."""
    msg = codec.decode_body(dumps(episodes_body(is_terminated=True, is_truncated=True)))
    frag = msg.episodes[0]
    assert frag.is_terminated and frag.is_truncated


def test_fragment_field_errors_name_the_fragment():
    """Errors inside ``episodes[i]`` say which fragment, not the (absent) fragment type."""
    body = episodes_body(rewards=_DELETE)
    body["episodes"].insert(0, episodes_body()["episodes"][0])
    body["env_steps"] = None
    with pytest.raises(BadMessage) as info:
        codec.decode_body(dumps(body))
    assert "episodes[1]" in str(info.value) and "None" not in str(info.value)


def test_decode_refuses_non_object_fragment():
    body = episodes_body()
    body["episodes"].append([1, 2])
    with pytest.raises(BadMessage, match=r"episodes\[1\] must be an object"):
        codec.decode_body(dumps(body))


@pytest.mark.parametrize("count", [3, 0, -1, "2", 2.0, True, [2]])
def test_decode_refuses_env_steps_mismatch(count):
    body = episodes_body()
    body["env_steps"] = count
    with pytest.raises(BadMessage, match="env_steps/timesteps says"):
        codec.decode_body(dumps(body))


def test_decode_accepts_ints_and_floats_mixed_in_arrays():
    msg = codec.decode_body(dumps(episodes_body(obs=[[0, 1.5], [2, 3], [4, 5]])))
    canonical = from_wire(msg.episodes[0], Box([2]), Discrete(2), "episodes[0]")
    np.testing.assert_array_equal(canonical.obs[""], [[0, 1.5], [2, 3], [4, 5]])
    assert canonical.obs[""].dtype == np.float32 and canonical.actions.dtype == np.float32


# ---------------------------------------------------------------- fuzzing
def _valid_frames() -> list[bytes]:
    frames = [codec.encode(m) for m in SIMPLE_MESSAGES]
    frames.append(codec.encode(codec.EpisodesAndGetState(
        episodes=(frag(2, action_logp=np.array([-0.5, -0.7]),
                       action_dist_inputs=np.array([[1.0, 2.0], [3.0, 4.0]])),),
        weights_seq_no=3)))
    frames.append(codec.encode_body(episodes_body()))
    frames.append(codec.encode_body({  # the additive keys of the off-policy and C-client work
        "type": "SET_CONFIG", "env_steps_per_sample": 8, "force_on_policy": False,
        "box_dist": "squashed_gaussian",
        "policies": {"default": {"box_dist": "squashed_gaussian", "algorithm": "sac"}}}))
    frames.append(codec.encode(codec.Attached(
        ring_name="r", board_path="/b", doorbell_path="/d", layout={"action_size": 1},
        policy_spec={}, env_steps_per_sample=4, force_on_policy=False, policy="default",
        network={"ops": [{"op": "Linear", "out": "y", "x": "x", "weight": "w", "bias": "b"}],
                 "params": [["w", [2, 4]], ["b", [2]]],
                 "dist": [{"kind": "categorical", "dist": 0, "width": 2, "action": 0,
                           "low": [], "high": []}]})))
    return frames


VALID_FRAMES = _valid_frames()


def _feed_everything(data: bytes, max_message_bytes: int = 4096) -> None:
    dec = FrameDecoder(max_message_bytes)
    dec.feed(data)
    while dec.next_message() is not None:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=300))
def test_fuzz_random_bytes_raise_only_protocol_errors(data):
    try:
        _feed_everything(data)
    except ProtocolError:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=300))
def test_fuzz_random_bodies_raise_only_protocol_errors(data):
    try:
        codec.decode_body(data)
    except ProtocolError:
        pass


@st.composite
def _mutated_frame(draw):
    frame = bytearray(draw(st.sampled_from(VALID_FRAMES)))
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "swap_token"]))
        pos = draw(st.integers(0, max(len(frame) - 1, 0)))
        if op == "flip" and frame:
            frame[pos] = draw(st.integers(0, 255))
        elif op == "insert":
            frame[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and frame:
            del frame[pos:pos + draw(st.integers(1, 8))]
        elif op == "truncate":
            del frame[pos:]
        else:  # replace a JSON token by another JSON token of a different type
            token = draw(st.sampled_from([b"null", b"true", b"[]", b"{}", b'"x"', b"-1", b"1e308",
                                          b"[[1],[2,3]]", b'[1,"2"]', b"18446744073709551616"]))
            frame[pos:pos + draw(st.integers(0, 6))] = token
    return bytes(frame)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frame=_mutated_frame())
def test_fuzz_mutated_frames_raise_only_protocol_errors(frame):
    try:
        _feed_everything(frame)
    except ProtocolError:
        pass
    try:  # the body alone, behind a correct header (mutations inside the JSON)
        _feed_everything(b"%08d" % len(frame[8:]) + frame[8:], max_message_bytes=1 << 16)
    except ProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(value=st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False,
                                                                                allow_infinity=False)
                          | st.text(max_size=5),
                          lambda children: st.lists(children, max_size=4)
                          | st.dictionaries(st.text(max_size=5), children, max_size=4),
                          max_leaves=20),
       key=st.sampled_from(["obs", "actions", "rewards", "action_logp", "action_dist_inputs",
                            "is_terminated", "is_truncated"]))
def test_fuzz_any_json_value_in_any_fragment_field(value, key):
    """Whatever JSON a fragment field holds, decoding either succeeds or raises BadMessage."""
    try:
        body = dumps(episodes_body(**{key: value}))
    except orjson.JSONEncodeError:  # e.g. integers beyond 64 bits
        return
    try:
        msg = codec.decode_body(body)
    except BadMessage:
        return
    f = msg.episodes[0]
    try:  # then the conversion against the spaces either succeeds or names the problem
        canonical = from_wire(f, Box([2]), Discrete(2), "episodes[0]")
    except InvalidValue:
        return
    assert len(canonical.obs[""]) == f.num_steps + 1 and len(canonical.actions) == f.num_steps


def test_message_dataclasses_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        codec.Ping().token = "x"  # type: ignore[misc]


_json_value = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40)
                           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=5),
                           lambda children: st.lists(children, max_size=4)
                           | st.dictionaries(st.text(max_size=8), children, max_size=4), max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(value=_json_value, kind=st.sampled_from(["SET_STATE", "WEIGHTS_READY"]))
def test_fuzz_any_exploration_value(value, kind):
    """The DQN `exploration` extension (server → client): whatever JSON it holds, decoding
    succeeds or raises BadMessage, and ``epsilon_of`` gives a rate in [0, 1] or None."""
    body = {"type": kind, "weights_seq_no": 3, "exploration": value}
    if kind == "SET_STATE":
        body["onnx_file"] = "eA=="
    try:
        msg = codec.decode_body(dumps(body))
    except BadMessage:
        return
    for policy in ("default", "red", ""):
        eps = codec.epsilon_of(msg.exploration, policy)
        assert eps is None or 0.0 <= eps <= 1.0
