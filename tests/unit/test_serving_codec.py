"""The serving, evaluation and metrics messages: round trips and every decode error."""
from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol import serving
from rlinkd.client_lib.protocol import serving as s
from rlinkd.client_lib.protocol.codec import BadMessage, MessageType

EXAMPLES = [
    s.StartEpisode(), s.StartEpisode("ep-1", False, "red_1", "red"),
    s.EpisodeStarted("ep-1", "default"),
    s.GetAction("ep-1", [0.1, 0.2]), s.Action("ep-1", 1, 7), s.Action("ep-1", None),
    s.LogReturns("ep-1", 1.5), s.EndEpisode("ep-1", [0.0], terminated=False, truncated=True),
    s.Step("ep-1", 1.0, {"pos": [1, 2]}, terminated=True),
    s.StepBatch((s.BatchEntry("a", [1.0], start=True, training_enabled=False, agent_id="x"),
                 s.BatchEntry("b", [2.0], reward=-1.0, truncated=True))),
    s.Actions([[0.5], None], [3, -1]),
    s.EvalResults((s.EvalEpisode(10.0, 10, 4, "default", "a"), s.EvalEpisode(-1.0, 0))),
    s.Metrics({"fps": 60.0, "sim/latency_ms": 3}),
    s.ServeAttach(123, 8, "default", "tok"),
    s.ServeAttached("rlinkd.lanes.x", 8, {"lane_bytes": 64}, "default", {"type": "Box"},
                    {"type": "Discrete", "n": 2}),
    s.ServeDirect(),
    s.ServeDirectReady(),
]


def round_trip(msg):
    return codec.decode_body(codec.encode(msg)[codec.HEADER_BYTES:])


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: m.TYPE.value)
def test_round_trip(msg):
    assert round_trip(msg) == msg


def test_every_serving_type_has_an_example():
    serving_types = set(s.DECODERS)
    assert {m.TYPE for m in EXAMPLES} == serving_types
    assert serving_types <= set(MessageType)


def decode(body: dict):
    return codec.decode_body(orjson.dumps(body))


@pytest.mark.parametrize("body, words", [
    ({"type": "GET_ACTION", "observation": [1]}, "episode_id"),
    ({"type": "GET_ACTION", "episode_id": "e"}, "observation"),
    ({"type": "GET_ACTION", "episode_id": "", "observation": [1]}, "episode_id"),
    ({"type": "GET_ACTION", "episode_id": "x" * 65, "observation": [1]}, "episode_id"),
    ({"type": "LOG_RETURNS", "episode_id": "e", "reward": "1"}, "reward"),
    ({"type": "LOG_RETURNS", "episode_id": "e", "reward": True}, "reward"),
    ({"type": "STEP", "episode_id": "e", "reward": 1e309, "observation": [1]}, "reward"),
    ({"type": "STEP", "episode_id": "e", "reward": -1e308, "observation": [1]}, "float32 range"),
    ({"type": "LOG_RETURNS", "episode_id": "e", "reward": 3.5e38}, "float32 range"),
    ({"type": "STEP_BATCH", "steps": [{"episode_id": "a", "observation": [1], "reward": 1e39}]},
     "float32 range"),
    ({"type": "STEP", "episode_id": "e", "observation": [1]}, "reward"),
    ({"type": "STEP", "episode_id": "e", "reward": 1, "observation": [1], "terminated": 1},
     "terminated"),
    ({"type": "START_EPISODE", "training_enabled": "no"}, "training_enabled"),
    ({"type": "START_EPISODE", "policy_id": 3}, "policy_id"),
    ({"type": "STEP_BATCH", "steps": []}, "1 to"),
    ({"type": "STEP_BATCH", "steps": [1]}, r"steps\[0\]"),
    ({"type": "STEP_BATCH", "steps": [{"episode_id": "a", "observation": [1]}]}, "reward"),
    ({"type": "STEP_BATCH", "steps": [{"episode_id": "a", "observation": [1], "start": True,
                                       "reward": 1}]}, "no reward"),
    ({"type": "STEP_BATCH", "steps": [{"episode_id": "a", "observation": [1], "reward": 1}] * 2},
     "twice"),
    ({"type": "STEP_BATCH", "steps": [{"episode_id": "a", "observation": [1], "reward": 1}]
      * (s.MAX_BATCH_STEPS + 1)}, "1 to"),
    ({"type": "EVAL_RESULTS", "episodes": [{"episode_return": 1}]}, "episode_length"),
    ({"type": "EVAL_RESULTS", "episodes": [{"episode_return": 1, "episode_length": -1}]},
     "episode_length"),
    ({"type": "EVAL_RESULTS", "episodes": [{"episode_return": float("nan"),
                                            "episode_length": 1}]}, "episode_return"),
    ({"type": "EVAL_RESULTS", "episodes": [{"episode_return": 1, "episode_length": 1}]
      * (s.MAX_EVAL_EPISODES + 1)}, "at most"),
    ({"type": "METRICS", "metrics": {"bad name": 1}}, "metric name"),
    ({"type": "METRICS", "metrics": {"x": "1"}}, "x"),
    ({"type": "METRICS", "metrics": {f"m{i}": 1 for i in range(s.MAX_METRICS_PER_MESSAGE + 1)}},
     "at most"),
    ({"type": "METRICS", "metrics": [1]}, "metrics"),
    ({"type": "SERVE_ATTACH", "pid": 1}, "lanes"),
])
def test_decode_errors_name_the_problem(body, words):
    with pytest.raises(BadMessage, match=words):
        decode(body)


def test_end_episode_defaults_to_terminated_unless_truncated():
    assert decode({"type": "END_EPISODE", "episode_id": "e", "observation": [1]}).terminated
    msg = decode({"type": "END_EPISODE", "episode_id": "e", "observation": [1], "truncated": True})
    assert msg.truncated and not msg.terminated


def test_metric_names():
    assert s.metric_name_error("sim/fps.mean-1_x") is None
    for bad in ("", "x" * 65, "a b", "é", 3, None):
        assert s.metric_name_error(bad)


_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=4), st.sampled_from(["e1", "c12-3", "bad id", "x" * 300]),
                    st.lists(st.floats(-2, 2), max_size=3))
_KEYS = st.sampled_from(["episode_id", "observation", "reward", "start", "terminated", "truncated",
                         "training_enabled", "agent_id", "policy_id", "other"])


_PLAIN_STEPS = st.fixed_dictionaries({  # (the plain step's keys: values near and far from valid)
    "episode_id": st.sampled_from(["e1", "c12-3", "", "bad id", "x" * 300, 7, None]),
    "observation": st.one_of(st.none(), st.lists(st.floats(-2, 2), max_size=3)),
    "reward": st.one_of(st.floats(), st.integers(-2, 2), st.booleans(), st.none(),
                        st.sampled_from([math.nan, math.inf, -math.inf]))})


@settings(max_examples=500, deadline=None)
@given(entry=st.one_of(st.dictionaries(_KEYS, _VALUES, max_size=5), _PLAIN_STEPS, _PLAIN_STEPS, _VALUES))
def test_the_common_entry_is_decoded_as_the_general_path_decodes_it(entry):
    """(decode_entry checks a plain step in a few lines; whatever it accepts, the general
    path accepts the same way, and everything else goes that path.)"""
    def outcome(decode):
        try:
            return decode(entry, 0)
        except BadMessage as exc:
            return str(exc)
    assert outcome(serving.decode_entry) == outcome(serving._decode_entry)
