"""client_lib.protocol.msgpack_flavour: frames recorded from real RLlib 2.49.0 / 2.60.0 clients
replayed, SingleAgentEpisode states through the collector's validation, a hostile corpus."""
from __future__ import annotations

import pickle
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlinkd.client_lib.protocol import codec, msgpack_flavour as mf
from rlinkd.client_lib.protocol.codec import BadMessage
from rlinkd.client_lib.protocol.spaces import Box, Discrete
from rlinkd.daemon.collector.core import CollectorCore, single_policy
from rlinkd.daemon.collector.ingest import Spaces
from rlinkd.daemon.config import load_config
from rlinkd.shm.records import StepLayout

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "rllib_msgpack"
VERSIONS = ("ray-2.49.0", "ray-2.60.0")
OBS = Box([4], low=-5.0, high=5.0)


def recorded(version: str) -> list[tuple[str, bytes]]:
    """(message type, whole frame) in the order the client sent them."""
    return [(p.stem.split("-", 1)[1], p.read_bytes())
            for p in sorted((FIXTURES / version).glob("*.bin"))]


def make_core() -> CollectorCore:
    cfg = load_config(resolve_dirs=False)
    return CollectorCore(cfg, single_policy(Spaces(OBS, Discrete(2), dist_size=2),
                                            StepLayout.flat(4, 1, 2)))


def buffer(data, lookback: int = 0) -> dict:
    return {"data": data, "lookback": lookback, "finalized": False, "space": None}


def sae(obs, actions, rewards, *, lookback: int = 0, terminated: bool = True,
        id_: str = "ep1", logits=None) -> dict:
    """A SingleAgentEpisode.get_state() map as RLlib's client sends it (the fields it reads)."""
    n = len(actions)
    logits = [np.zeros(2, np.float32)] * n if logits is None else logits
    return {"id_": id_, "agent_id": None, "module_id": None, "multi_agent_episode_id": None,
            "observations": buffer([np.asarray(o, np.float32) for o in obs], lookback),
            "actions": buffer(list(actions), lookback), "rewards": buffer(list(rewards), lookback),
            "infos": buffer([{}] * (len(obs))), "extra_model_outputs": {
                "action_dist_inputs": buffer(list(logits), lookback),
                "action_logp": buffer([-0.69] * n, lookback)},
            "is_terminated": terminated, "is_truncated": False, "t": n, "t_started": 0,
            "custom_data": {}}


def body(message: dict) -> bytes:
    return mf.encode(message)[codec.HEADER_BYTES:]


def episodes_body(*states, kind: str = "EPISODES_AND_GET_STATE") -> bytes:
    return body({"type": kind, "episodes": list(states)})


# ---------------------------------------------------------------- recorded frames
@pytest.mark.parametrize("version", VERSIONS)
def test_recorded_frames_decode_to_the_same_requests_as_json(version):
    frames = recorded(version)
    assert [kind for kind, _ in frames[:3]] == ["PING", "GET_CONFIG", "GET_STATE"]
    for kind, frame in frames:
        assert codec.parse_header(frame[:8], 1 << 20) == len(frame) - 8
        assert mf.is_msgpack(frame[8:]) and not mf.is_msgpack(codec.encode(codec.Ping())[8:])
        msg = mf.decode_body(frame[8:])
        assert msg.TYPE.value == kind
    episodes = [mf.decode_body(f[8:]) for k, f in frames if k == "EPISODES_AND_GET_STATE"]
    assert all(m.num_steps == 32 for m in episodes)  # the recorder's rollout_fragment_length
    frag = episodes[0].episodes[0]
    assert np.asarray(frag.obs).shape == (frag.num_steps + 1, 4)
    assert frag.action_dist_inputs.shape == (frag.num_steps, 2)
    assert frag.action_logp.shape == (frag.num_steps,) and frag.episode_id


@pytest.mark.parametrize("version", VERSIONS)
def test_recorded_episodes_enter_the_collector_and_continue_by_id(version):
    core = make_core()
    session = core.open_session("rllib", "tcp")
    steps = 0
    for kind, frame in recorded(version):
        plan = core.handle(session, mf.decode_body(frame[8:]))
        if kind.startswith("EPISODES"):
            steps += 32
            assert plan.records is not None and plan.wait_for_training
    assert core.env_steps == steps and core.stats.episodes >= 2
    # the recording cuts episodes between messages: a cut one is still open (continued by id)
    cut = [e for k, f in recorded(version) if k.startswith("EPISODES")
           for e in mf.decode_body(f[8:]).episodes][-1]
    assert not cut.is_terminated and "" in session.agents


def test_lookback_steps_are_dropped():
    obs = np.arange(15, dtype=np.float32).reshape(5, 3).tolist()
    obs = [[*o, 0.0] for o in obs]
    state = sae(obs, [0, 1, 0, 1], [1.0, 2.0, 3.0, 4.0], lookback=2,
                logits=[np.full(2, i, np.float32) for i in range(4)])
    state["observations"]["lookback"] = 2  # obs: 2 lookback + (T + 1)
    frag = mf.decode_body(episodes_body(state)).episodes[0]
    assert frag.num_steps == 2 and frag.rewards.tolist() == [3.0, 4.0]
    assert frag.actions == [0, 1] and np.asarray(frag.obs)[0][0] == 6.0
    assert frag.action_dist_inputs[:, 0].tolist() == [2.0, 3.0]


def test_bad_episodes_get_the_json_flavours_errors():
    """The same bad episode sent both ways: the same error, word for word."""
    cases = [  # (obs, actions, rewards)
        ([[0.0] * 4] * 3, [0, 1], [1.0]),             # rewards one short
        ([[0.0] * 4, [9.0] * 4], [0], [1.0]),          # obs outside the Box
        ([[0.0] * 4, [0.0] * 4], [5], [1.0]),          # action outside Discrete(2)
        ([[0.0] * 3, [0.0] * 3], [0], [1.0]),          # wrong obs shape
    ]
    for obs, actions, rewards in cases:
        wire = codec.EpisodeFragment(obs=obs, actions=actions, rewards=np.asarray(rewards, float),
                                     is_terminated=True, is_truncated=False)
        errors = []
        for decode, data in ((codec.decode_body, codec.encode(codec.EpisodesAndGetState(
                episodes=(wire,)))[8:]), (mf.decode_body, episodes_body(sae(obs, actions, rewards)))):
            core = make_core()
            with pytest.raises(BadMessage) as info:
                core.handle(core.open_session("p", "tcp"), decode(data))
            errors.append(str(info.value))
        assert errors[0] == errors[1], (obs, actions, rewards)


def test_an_ended_episode_id_is_not_continued():
    core = make_core()
    session = core.open_session("p", "tcp")
    obs = [[0.0] * 4] * 3
    core.handle(session, mf.decode_body(episodes_body(sae(obs, [0, 1], [1.0, 1.0], id_="a"))))
    with pytest.raises(BadMessage, match="episode 'a' already ended"):
        core.handle(session, mf.decode_body(episodes_body(sae(obs, [0, 1], [1.0, 1.0], id_="a"))))


@pytest.mark.parametrize("keys", [0, 1, 15, 16, 2**16])
def test_every_msgpack_map_header_is_msgpack_and_json_is_not(keys):
    data = msgpack.packb({f"k{i}": 0 for i in range(keys)})
    assert mf.is_msgpack(data) and mf.unpack(data) == {f"k{i}": 0 for i in range(keys)}
    assert not mf.is_msgpack(b'{"type": "PING"}') and not mf.is_msgpack(b" {}")


def test_encode_makes_msgpack_numpy_maps():
    frame = mf.encode({"type": "SET_STATE", "state": {"w": np.ones((2, 3), np.float32)}})
    raw = msgpack.unpackb(frame[8:], raw=False)
    assert raw["state"]["w"] == {b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [2, 3],
                                 b"data": np.ones((2, 3), np.float32).tobytes()}
    assert np.array_equal(mf.unpack(frame[8:])["state"]["w"], np.ones((2, 3), np.float32))
    with pytest.raises(TypeError):
        mf.encode({"x": np.array(["a"])})


# ---------------------------------------------------------------- hostile corpus
class Boom:
    """Unpickling this runs code: pickle.loads(dumps(Boom())) calls boom()."""

    def __reduce__(self):
        return (_boom, ())


RAN: list[str] = []


def _boom():
    RAN.append("code ran")
    return np.zeros(1)


def nd(kind=b"", dtype="<f4", shape=(1,), data=b"\0\0\0\0", extra=None) -> dict:
    return {b"nd": True, b"type": dtype, b"kind": kind, b"shape": list(shape), b"data": data,
            **(extra or {})}


def with_obs(value) -> bytes:
    state = sae([[0.0] * 4] * 2, [0], [1.0])
    state["observations"]["data"] = value
    return body({"type": "EPISODES", "episodes": [state]})


def nested(depth: int) -> bytes:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return msgpack.packb({"type": "PING", "x": value}, use_bin_type=True)


HOSTILE = {
    "object array (pickle)": with_obs(nd(kind=b"O", dtype="|O", data=pickle.dumps(Boom()))),
    "object dtype": with_obs(nd(dtype="|O", data=pickle.dumps(Boom()))),
    "void array": with_obs(nd(kind=b"V", dtype=[["a", "<f4"]])),
    "scalar of object dtype": with_obs({b"nd": False, b"type": "|O", b"data": pickle.dumps(Boom())}),
    "unicode dtype": with_obs(nd(dtype="<U1")),
    "datetime dtype": with_obs(nd(dtype="<M8[s]", data=b"\0" * 8)),
    "big-endian dtype": with_obs(nd(dtype=">f4")),
    "huge declared shape": with_obs(nd(shape=(2**40, 2**40))),
    "shape product overflowing int64": with_obs(nd(shape=(2**63, 2**63, 4))),
    "negative shape": with_obs(nd(shape=(-1,))),
    "too many dims": with_obs(nd(shape=(1,) * 9)),
    "float shape": with_obs(nd(shape=(1.0,))),
    "bool shape": with_obs(nd(shape=(True,))),
    "short data": with_obs(nd(shape=(4,))),
    "data as str": with_obs(nd(data="abcd")),
    "extra key": with_obs(nd(extra={b"x": 1})),
    "nd not bool": with_obs({b"nd": 1, b"type": "<f4", b"data": b"\0" * 4}),
    "extension type": msgpack.packb({"type": "PING", "x": msgpack.ExtType(5, b"abc")},
                                    use_bin_type=True),
    "timestamp": msgpack.packb({"type": "PING", "x": msgpack.Timestamp(1, 0)}, use_bin_type=True),
    "deep lists": nested(100),
    "very deep lists": b"\x81\xa4type" + b"\x91" * 5000 + b"\x01",
    "very deep maps": b"\x81\xa1x" * 5000 + b"\x01",
    "int map key": msgpack.packb({"type": "PING", 1: 2}, use_bin_type=True),
    "bad utf-8": b"\x81\xa4type\xa2\xff\xfe",
    "array length beyond the body": b"\x81\xa4type\xdd\xff\xff\xff\xff",
    "str length beyond the body": b"\x81\xa4type\xdb\xff\xff\xff\xff",
    "trailing bytes": msgpack.packb({"type": "PING"}) + b"\x00",
    "not a map": msgpack.packb([1, 2]),
    "empty": b"",
    "unknown type": msgpack.packb({"type": "SET_STATE"}),
    "type not str": msgpack.packb({"type": [1] * 10}),
    "episodes not a list": msgpack.packb({"type": "EPISODES", "episodes": {}}),
    "episode not a map": msgpack.packb({"type": "EPISODES", "episodes": [1]}),
    "lookback past the data": body({"type": "EPISODES", "episodes": [
        sae([[0.0] * 4] * 2, [0], [1.0], lookback=3)]}),
    "lookback not an int": body({"type": "EPISODES", "episodes": [
        sae([[0.0] * 4] * 2, [0], [1.0], lookback="1")]}),
    "multi-agent episode": body({"type": "EPISODES", "episodes": [
        {**sae([[0.0] * 4] * 2, [0], [1.0]), "agent_id": "a"}]}),
}
REASONS = {
    'object array (pickle)': "kind b'O' refused",
    'object dtype': "dtype '|O' refused",
    'void array': "kind b'V' refused",
    'scalar of object dtype': "dtype '|O' refused",
    'unicode dtype': "dtype '<U1' refused",
    'datetime dtype': "dtype '<M8[s]' refused",
    'big-endian dtype': "dtype '>f4' refused",
    'huge declared shape': 'array data holds 4 bytes',
    'shape product overflowing int64': 'array data holds 4 bytes',
    'negative shape': 'array shape must be',
    'too many dims': 'array shape must be',
    'float shape': 'array shape must be',
    'bool shape': 'array shape must be',
    'short data': 'array data holds 4 bytes, its shape and dtype need 16',
    'data as str': 'array data holds no bytes',
    'extra key': 'malformed array map',
    'nd not bool': 'malformed array map',
    'extension type': 'extension type 5 is refused',
    'timestamp': 'Timestamp values are refused',
    'deep lists': 'nesting deeper than 32',
    'very deep lists': 'StackError',
    'very deep maps': 'StackError',
    'int map key': 'not allowed for map key',
    'bad utf-8': 'utf-8',
    'array length beyond the body': 'exceeds max_array_len',
    'str length beyond the body': 'incomplete input',
    'trailing bytes': 'trailing bytes',
    'not a map': 'not a msgpack map',
    'empty': 'not a msgpack map',
    'unknown type': "unknown message type 'SET_STATE'",
    'type not str': 'unknown message type',
    'episodes not a list': "missing field 'episodes'",
    'episode not a map': 'must be a map',
    'lookback past the data': 'lookback must be an integer in 0..len(data)',
    'lookback not an int': 'lookback must be an integer in 0..len(data)',
    'multi-agent episode': 'multi-agent episodes are not served',
}




@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_bodies_are_bad_messages_and_run_nothing(name, monkeypatch):
    def no_unpickling(*args, **kwargs):
        raise AssertionError("something received was unpickled")
    monkeypatch.setattr(pickle, "loads", no_unpickling)
    monkeypatch.setattr(pickle, "load", no_unpickling)
    monkeypatch.setattr(pickle, "Unpickler", no_unpickling)
    RAN.clear()
    core = make_core()
    with pytest.raises(BadMessage) as info:
        core.handle(core.open_session("p", "tcp"), mf.decode_body(HOSTILE[name]))
    assert REASONS[name] in str(info.value)  # refused by the decoder, for this reason
    assert not RAN and core.env_steps == 0


def test_the_object_array_payload_would_run_code_if_unpickled():
    """The corpus' pickle is live: unpickling it runs ``_boom`` (so the test above can fail)."""
    RAN.clear()
    pickle.loads(pickle.dumps(Boom()))
    assert RAN == ["code ran"]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_truncation_of_a_recorded_frame_is_a_bad_message(version):
    frame = recorded(version)[3][1][8:]
    for cut in range(len(frame)):
        with pytest.raises(BadMessage):
            mf.decode_body(frame[:cut])


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.data())
def test_mutated_recorded_frames_decode_or_fail_cleanly(data):
    frames = [f[8:] for v in VERSIONS for _, f in recorded(v)]
    frame = bytearray(data.draw(st.sampled_from(frames)))
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(frame) - 1))
        frame[i] = data.draw(st.integers(0, 255))
    core = make_core()
    try:
        core.handle(core.open_session("p", "tcp"), mf.decode_body(bytes(frame)))
    except BadMessage:
        pass
