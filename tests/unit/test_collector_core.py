"""daemon.collector.core: message plans, authentication, WaitBook, concat_records (pure)."""
from __future__ import annotations

import hmac

import numpy as np
import pytest

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol.codec import BadMessage, EpisodeFragment
from rlinkd.client_lib.protocol.spaces import Box, Discrete, space_from_json
from rlinkd.daemon.collector import core as core_mod
from rlinkd.daemon.collector.core import (CollectorCore, Plan, Session, Unauthenticated, WaitBook,
                                   concat_records)
from rlinkd.daemon.collector.ingest import InvalidEpisode, Spaces
from rlinkd.daemon.config import load_config
from rlinkd.shm.records import FINAL_OBS, TERMINATED, StepLayout

OBS = Box([2], low=-10.0, high=10.0)
ACT = Discrete(3)
LAYOUT = StepLayout.flat(2, 1, 3)


def make_core(*overrides, counters=None) -> CollectorCore:
    cfg = load_config(overrides=list(overrides), resolve_dirs=False)
    return CollectorCore(cfg, Spaces(OBS, ACT, dist_size=3), LAYOUT, counters=counters)


def frag(t: int, start: float = 0.0, *, terminated=False, truncated=False,
         rewards=None) -> EpisodeFragment:
    obs = start + np.arange((t + 1) * 2, dtype=np.float64).reshape(t + 1, 2) / 10
    return EpisodeFragment(obs=obs.tolist(), actions=(np.arange(t) % 3).tolist(),
                           rewards=np.ones(t) if rewards is None else np.asarray(rewards, float),
                           is_terminated=terminated, is_truncated=truncated)


def decode_reply(plan: Plan) -> codec.Message:
    assert plan.reply is not None
    assert codec.parse_header(plan.reply[:8], 1 << 20) == len(plan.reply) - 8
    return codec.decode_body(plan.reply[8:])


# ---------------------------------------------------------------- simple requests
def test_ping_replies_pong_and_nothing_else():
    core = make_core()
    plan = core.handle(core.open_session("peer", "tcp"), codec.Ping())
    assert decode_reply(plan) == codec.Pong()
    assert plan.records is None and not plan.newest_state and not plan.wait_for_training
    assert core.messages == 1


@pytest.mark.parametrize("force", [True, False])
def test_get_config_sends_set_config_with_extensions(force):
    core = make_core(("sampling", "env_steps_per_sample", 77),
                     ("sampling", "force_on_policy", force))
    reply = decode_reply(core.handle(core.open_session("p", "tcp"), codec.GetConfig()))
    assert reply == codec.SetConfig(env_steps_per_sample=77, force_on_policy=force,
                                    observation_space=OBS.to_json(), action_space=ACT.to_json(),
                                    protocol_version=codec.PROTOCOL_VERSION, compact_arrays=True)
    # the seed's keys, exactly as a seed-only client reads them
    body = codec.orjson.loads(core.handle(core.open_session("q", "tcp"),
                                          codec.GetConfig()).reply[8:])
    assert body["type"] == "SET_CONFIG" and body["env_steps_per_sample"] == 77
    assert body["force_on_policy"] is force
    assert space_from_json(body["observation_space"]) == OBS
    assert space_from_json(body["action_space"]) == ACT and body["compact_arrays"] is True


def test_get_state_plans_the_newest_weights():
    core = make_core()
    plan = core.handle(core.open_session("p", "tcp"), codec.GetState())
    assert plan == Plan(newest_state=True)


def test_status_plans_a_status_report():
    core = make_core()
    assert core.handle(core.open_session("p", "unix"), codec.Status()) == Plan(status=True)


@pytest.mark.parametrize("msg", [codec.Pong(), codec.SetState(weights_seq_no=1, onnx_file=""),
                                 codec.Error(message="x"),
                                 codec.SetConfig(env_steps_per_sample=1, force_on_policy=True)])
def test_server_side_messages_are_refused(msg):
    core = make_core()
    with pytest.raises(BadMessage, match="is not a request this server accepts"):
        core.handle(core.open_session("p", "tcp"), msg)


# ---------------------------------------------------------------- episodes
def test_episodes_ingests_without_replying():
    core = make_core()
    session = core.open_session("p", "tcp")
    plan = core.handle(session, codec.Episodes(episodes=(frag(3), frag(2, 5.0, terminated=True)),
                                               weights_seq_no=4))
    assert plan.reply is None and not plan.newest_state and not plan.wait_for_training
    rec = plan.records
    assert rec.dtype == LAYOUT.dtype and len(rec) == (3 + 1) + (2 + 1)
    assert (rec["stream_id"] == session.stream_id).all()
    assert (rec["weights_seq_no"] == 4).all()
    assert list(rec["flags"] & FINAL_OBS) == [0, 0, 0, FINAL_OBS, 0, 0, FINAL_OBS]
    assert rec["flags"][-1] & TERMINATED
    np.testing.assert_array_equal(rec["obs"]["obs"][3], np.float32([0.6, 0.7]))  # first's final obs
    np.testing.assert_array_equal(rec["obs"]["obs"][4], np.float32([5.0, 5.1]))  # second's reset obs
    assert session.is_sampler and session.env_steps == 5 and core.env_steps == 5
    assert core.stats.episodes == 1 and list(core.stats.lengths) == [2]
    assert core.counters() == {"env_steps": 5, "episodes": 1}


def test_episodes_and_get_state_on_policy_waits_for_training():
    core = make_core(("sampling", "force_on_policy", True))
    plan = core.handle(core.open_session("p", "tcp"),
                       codec.EpisodesAndGetState(episodes=(frag(2),)))
    assert plan.records is not None and len(plan.records) == 3
    assert plan.wait_for_training and not plan.newest_state and plan.reply is None


def test_episodes_and_get_state_off_policy_gets_newest_state():
    core = make_core(("sampling", "force_on_policy", False))
    plan = core.handle(core.open_session("p", "tcp"),
                       codec.EpisodesAndGetState(episodes=(frag(2),)))
    assert plan.newest_state and not plan.wait_for_training and len(plan.records) == 3


def test_missing_weights_seq_no_uses_the_last_weights_sent():
    core = make_core()
    session = core.open_session("p", "tcp")
    assert (core.handle(session, codec.Episodes(episodes=(frag(1),))).records["weights_seq_no"]
            == -1).all()
    session.last_sent_seq = 12
    assert (core.handle(session, codec.Episodes(episodes=(frag(1),))).records["weights_seq_no"]
            == 12).all()


def test_fragments_continue_across_messages():
    core = make_core()
    session = core.open_session("p", "tcp")
    core.handle(session, codec.Episodes(episodes=(frag(3, rewards=[1, 2, 3]),)))
    cont = EpisodeFragment(obs=[[0.6, 0.7], [1.0, 1.0]], actions=[0],
                           rewards=np.array([4.0]), is_terminated=True, is_truncated=False)
    core.handle(session, codec.Episodes(episodes=(cont,)))
    assert list(core.stats.returns) == [10.0] and list(core.stats.lengths) == [4]


def test_invalid_fragment_rejects_the_whole_message_and_counts_nothing():
    core = make_core()
    session = core.open_session("p", "tcp")
    bad = EpisodeFragment(obs=[[0.0, 0.0], [0.0, 0.0]], actions=[7], rewards=np.ones(1),
                          is_terminated=True, is_truncated=False)
    with pytest.raises(InvalidEpisode, match=r"episodes\[1\]\.actions"):
        core.handle(session, codec.Episodes(episodes=(frag(2, terminated=True), bad)))
    assert core.env_steps == 0 and session.env_steps == 0 and core.stats.episodes == 0
    assert not session.is_sampler


def test_composite_episodes_in_compact_form_become_per_leaf_records():
    from rlinkd.client_lib.protocol.compact import encode_compact
    from rlinkd.client_lib.protocol.spaces import Dict, record_fields
    obs_space = Dict({"camera": Box([4, 4, 3], "uint8", 0, 255), "speed": Box([1], low=0.0, high=9.0)})
    layout = StepLayout(record_fields(obs_space), 1, 3)
    core = CollectorCore(load_config(resolve_dirs=False), Spaces(obs_space, ACT, dist_size=3), layout)
    cameras = np.arange(3 * 48, dtype=np.uint8).reshape(3, 4, 4, 3)
    wire = EpisodeFragment(obs={"camera": encode_compact(cameras), "speed": [[0.5], [1.0], [1.5]]},
                           actions=[2, 0], rewards=np.ones(2), is_terminated=True, is_truncated=False)
    reply = decode_reply(core.handle(core.open_session("p", "tcp"), codec.GetConfig()))
    assert space_from_json(reply.observation_space) == obs_space
    rec = core.handle(core.open_session("p", "tcp"), codec.Episodes(episodes=(wire,))).records
    assert rec.dtype == layout.dtype and rec["obs"]["camera"].dtype == np.uint8
    np.testing.assert_array_equal(rec["obs"]["camera"], cameras)
    np.testing.assert_array_equal(rec["obs"]["speed"][:, 0], np.float32([0.5, 1.0, 1.5]))
    np.testing.assert_array_equal(rec["action"][:2, 0], [2, 0])
    bad = EpisodeFragment(obs={"camera": encode_compact(cameras[:, :2]), "speed": [[0.5]] * 3},
                          actions=[2, 0], rewards=np.ones(2), is_terminated=True, is_truncated=False)
    with pytest.raises(InvalidEpisode, match=r'episodes\[0\]\.obs\["camera"\]: shape \[2, 4, 3\]'):
        core.handle(core.open_session("p", "tcp"), codec.Episodes(episodes=(bad,)))


def test_counters_resume_from_a_checkpoint():
    core = make_core(counters={"env_steps": 1000, "episodes": 7})
    core.handle(core.open_session("p", "tcp"), codec.Episodes(episodes=(frag(2, terminated=True),)))
    assert core.counters() == {"env_steps": 1002, "episodes": 8}


def test_sessions_get_distinct_stream_ids_and_close():
    core = make_core()
    a, b = core.open_session("a", "tcp"), core.open_session("b", "unix")
    assert a.stream_id != b.stream_id and a.stream_id >= 1
    core.handle(a, codec.Episodes(episodes=(frag(1),)))
    assert core.samplers() == [a]
    core.close_session(a)
    assert core.samplers() == [] and list(core.sessions) == [b.id]


# ---------------------------------------------------------------- authentication
def test_no_token_configured_means_authenticated():
    core = make_core()
    assert core.open_session("p", "tcp").authenticated


@pytest.mark.parametrize("first", [codec.GetConfig(), codec.Ping(),
                                   codec.Episodes(episodes=(frag(1),)), codec.GetState()])
def test_token_required_before_anything_else(first):
    core = make_core(("server", "token", "s3cret"))
    session = core.open_session("p", "tcp")
    assert not session.authenticated
    with pytest.raises(Unauthenticated, match="authentication required"):
        core.handle(session, first)
    assert not session.authenticated and core.env_steps == 0


def test_wrong_token_is_refused_and_right_token_accepted(monkeypatch):
    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(core_mod.hmac, "compare_digest", spy)
    core = make_core(("server", "token", "s3cret"))
    session = core.open_session("p", "tcp")
    with pytest.raises(Unauthenticated, match="wrong token"):
        core.handle(session, codec.Ping(token="s3cre"))
    assert not session.authenticated
    assert calls == [(b"s3cre", b"s3cret")]
    plan = core.handle(session, codec.Ping(token="s3cret"))
    assert session.authenticated and decode_reply(plan) == codec.Pong()
    assert len(calls) == 2
    # once authenticated, no token is needed
    assert decode_reply(core.handle(session, codec.GetConfig())).TYPE is codec.MessageType.SET_CONFIG


def test_status_may_carry_the_token():
    core = make_core(("server", "token", "tök"))
    session = core.open_session("p", "unix")
    assert core.handle(session, codec.Status(token="tök")) == Plan(status=True)
    assert session.authenticated


def test_unauthenticated_is_a_bad_message():
    assert issubclass(Unauthenticated, BadMessage)


# ---------------------------------------------------------------- WaitBook
def sessions(n: int) -> list[Session]:
    return [Session(id=i, stream_id=i, peer="p", transport="tcp", authenticated=True,
                    is_sampler=True) for i in range(1, n + 1)]


def test_released_returns_only_satisfied_waiters_and_clears_them():
    book = WaitBook(max_wait_s=5.0)
    a, b, c = sessions(3)
    book.start_wait(a, cutoff=10, now=0.0)
    book.start_wait(b, cutoff=20, now=0.0)
    assert book.released([a, b, c], cutoff=9) == []
    assert book.released([a, b, c], cutoff=10) == [a]
    assert a.waiting_cutoff is None and b.waiting_cutoff == 20 and c.waiting_cutoff is None
    assert book.released([a, b, c], cutoff=10) == []
    assert book.released([a, b, c], cutoff=100) == [b]


def test_should_flush_when_every_sampler_waits():
    book = WaitBook(max_wait_s=5.0)
    a, b = sessions(2)
    assert not book.should_flush([a, b], last_ingest_id=10, now=0.0)  # nobody waits
    book.start_wait(a, 10, now=0.0)
    assert not book.should_flush([a, b], last_ingest_id=10, now=1.0)  # b still sampling
    book.start_wait(b, 12, now=1.0)
    assert book.should_flush([a, b], last_ingest_id=12, now=1.0)


def test_should_flush_when_one_waits_too_long():
    book = WaitBook(max_wait_s=5.0)
    a, b = sessions(2)
    book.start_wait(a, 10, now=100.0)
    assert not book.should_flush([a, b], 10, now=105.0)     # exactly max_wait: not yet
    assert book.should_flush([a, b], 10, now=105.01)


def test_should_flush_not_again_for_the_same_data():
    book = WaitBook(max_wait_s=5.0)
    (a,) = sessions(1)
    book.start_wait(a, 10, now=0.0)
    assert book.should_flush([a], 10, now=0.0)
    book.last_flush_cutoff = 10           # the shell records the flush it asked for
    assert not book.should_flush([a], 10, now=60.0)
    assert book.should_flush([a], 11, now=60.0)


# ---------------------------------------------------------------- concat_records
def test_concat_records_keeps_the_padded_dtype():
    layout = StepLayout.flat(3, 1, 0)  # 45 bytes of fields, padded to 48
    assert layout.dtype.itemsize == 48
    parts = [layout.empty(2), layout.empty(0), layout.empty(3)]
    for i, part in enumerate(parts):
        part["stream_id"] = i + 1
        part["obs"]["obs"] = np.arange(len(part) * 3).reshape(-1, 3) + 10 * i
    out = concat_records(parts, layout.dtype)
    assert out.dtype == layout.dtype and out.dtype.itemsize == 48 and len(out) == 5
    assert np.concatenate(parts).dtype != layout.dtype  # why concat_records exists
    assert list(out["stream_id"]) == [1, 1, 3, 3, 3]
    np.testing.assert_array_equal(out["obs"]["obs"][2:], np.arange(9).reshape(3, 3) + 20)
    assert len(concat_records([], layout.dtype)) == 0
