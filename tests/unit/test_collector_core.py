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
                                          concat_records, single_policy)
from rlinkd.daemon.collector.ingest import InvalidEpisode, Spaces
from rlinkd.daemon.config import load_config
from rlinkd.shm.records import FINAL_OBS, TERMINATED, StepLayout

OBS = Box([2], low=-10.0, high=10.0)
ACT = Discrete(3)
LAYOUT = StepLayout.flat(2, 1, 3)


def make_core(*overrides, counters=None) -> CollectorCore:
    cfg = load_config(overrides=list(overrides), resolve_dirs=False)
    return CollectorCore(cfg, single_policy(Spaces(OBS, ACT, dist_size=3), LAYOUT), counters=counters)


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
                                    protocol_version=codec.PROTOCOL_VERSION, compact_arrays=True,
                                    policies={"default": {"observation_space": OBS.to_json(),
                                                          "action_space": ACT.to_json(),
                                                          "trainable": True}},
                                    policy_mapping=[], max_agents_per_connection=1024)
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
    rec = plan.records["default"]
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
    assert plan.records is not None and len(plan.records["default"]) == 3
    assert plan.wait_for_training and not plan.newest_state and plan.reply is None


def test_episodes_and_get_state_off_policy_gets_newest_state():
    core = make_core(("sampling", "force_on_policy", False))
    plan = core.handle(core.open_session("p", "tcp"),
                       codec.EpisodesAndGetState(episodes=(frag(2),)))
    assert plan.newest_state and not plan.wait_for_training and len(plan.records["default"]) == 3


def test_missing_weights_seq_no_uses_the_last_weights_sent():
    core = make_core()
    session = core.open_session("p", "tcp")
    assert (core.handle(session, codec.Episodes(episodes=(frag(1),))).records["default"][
        "weights_seq_no"] == -1).all()
    session.last_sent_seq = 12
    assert (core.handle(session, codec.Episodes(episodes=(frag(1),))).records["default"][
        "weights_seq_no"] == 12).all()


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
    core = CollectorCore(load_config(resolve_dirs=False), single_policy(Spaces(obs_space, ACT, dist_size=3), layout))
    cameras = np.arange(3 * 48, dtype=np.uint8).reshape(3, 4, 4, 3)
    wire = EpisodeFragment(obs={"camera": encode_compact(cameras), "speed": [[0.5], [1.0], [1.5]]},
                           actions=[2, 0], rewards=np.ones(2), is_terminated=True, is_truncated=False)
    reply = decode_reply(core.handle(core.open_session("p", "tcp"), codec.GetConfig()))
    assert space_from_json(reply.observation_space) == obs_space
    rec = core.handle(core.open_session("p", "tcp"), codec.Episodes(episodes=(wire,))).records["default"]
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
    book.start_wait(a, {"default": 10}, now=0.0)
    book.start_wait(b, {"default": 20}, now=0.0)
    assert book.released([a, b, c], "default", cutoff=9) == []
    assert book.released([a, b, c], "default", cutoff=10) == [a]
    assert not a.waiting and b.waiting == {"default": 20} and not c.waiting
    assert book.released([a, b, c], "default", cutoff=10) == []
    assert book.released([a, b, c], "red", cutoff=100) == []   # another policy's weights
    assert book.released([a, b, c], "default", cutoff=100) == [b]


def test_a_client_waiting_for_two_policies_is_released_when_both_trained_its_steps():
    book = WaitBook(max_wait_s=5.0)
    (a,) = sessions(1)
    book.start_wait(a, {"default": 10, "red": 3}, now=0.0)
    assert book.released([a], "red", cutoff=3) == [] and a.waiting == {"default": 10}
    assert book.released([a], "default", cutoff=10) == [a] and not a.waiting


def test_records_trained_before_the_wait_starts_need_no_wait():
    """The connector may train a client's records (and publish) before its SAMPLE_READY or
    EPISODES_AND_GET_STATE wait starts: that wait must not wait for another publish."""
    book = WaitBook(max_wait_s=5.0)
    a, b = sessions(2)
    assert book.released([a, b], "default", cutoff=10) == []   # nobody waits yet
    assert not book.start_wait(a, {"default": 10}, now=0.0) and not a.waiting
    assert book.start_wait(b, {"default": 11, "red": 3}, now=0.0) and b.waiting == {"default": 11, "red": 3}
    assert book.released([a, b], "red", cutoff=2) == []
    assert not book.start_wait(a, {"default": 8, "red": 2}, now=0.0)   # both trained already
    assert book.start_wait(a, {"default": 10, "red": 3}, now=0.0) and a.waiting == {"red": 3}


def test_should_flush_when_every_sampler_waits():
    book = WaitBook(max_wait_s=5.0)
    a, b = sessions(2)
    assert not book.should_flush([a, b], "default", last_ingest_id=10, now=0.0)  # nobody waits
    book.start_wait(a, {"default": 10}, now=0.0)
    assert not book.should_flush([a, b], "default", last_ingest_id=10, now=1.0)  # b sampling
    book.start_wait(b, {"red": 12}, now=1.0)   # b waits for another policy: all wait now
    assert book.should_flush([a, b], "default", last_ingest_id=10, now=1.0)
    assert book.should_flush([a, b], "red", last_ingest_id=12, now=1.0)
    assert not book.should_flush([a, b], "blue", last_ingest_id=12, now=1.0)  # none wait for it


def test_should_flush_when_one_waits_too_long():
    book = WaitBook(max_wait_s=5.0)
    a, b = sessions(2)
    book.start_wait(a, {"default": 10}, now=100.0)
    assert not book.should_flush([a, b], "default", 10, now=105.0)  # exactly max_wait: not yet
    assert book.should_flush([a, b], "default", 10, now=105.01)


def test_should_flush_not_again_for_the_same_data():
    book = WaitBook(max_wait_s=5.0)
    (a,) = sessions(1)
    book.start_wait(a, {"default": 10}, now=0.0)
    assert book.should_flush([a], "default", 10, now=0.0)
    book.last_flush_cutoff["default"] = 10   # the shell records the flush it asked for
    assert not book.should_flush([a], "default", 10, now=60.0)
    assert book.should_flush([a], "default", 11, now=60.0)


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


# ---------------------------------------------------------------- many agents, several policies
def multi_core(max_agents: int = 4) -> CollectorCore:
    cfg = load_config(overrides=[("policies", "red.trainable", True),
                                 ("policies", "blue.trainable", True),
                                 ("policy_mapping", "red_*", "red"),
                                 ("policy_mapping", "blue_*", "blue"),
                                 ("server", "max_agents_per_connection", max_agents)],
                      resolve_dirs=False)
    spaces = Spaces(OBS, ACT, dist_size=3)
    return CollectorCore(cfg, {"default": core_mod.PolicyInfo(spaces, LAYOUT),
                               "red": core_mod.PolicyInfo(spaces, LAYOUT),
                               "blue": core_mod.PolicyInfo(spaces, LAYOUT, trainable=False)})


def agent_frag(agent: str | None, t: int, start: float = 0.0, episode: str | None = None,
               policy: str | None = None, **kw) -> EpisodeFragment:
    base = frag(t, start, **kw)
    return EpisodeFragment(obs=base.obs, actions=base.actions, rewards=base.rewards,
                           is_terminated=base.is_terminated, is_truncated=base.is_truncated,
                           agent_id=agent, episode_id=episode, policy_id=policy)


def test_each_agent_goes_to_its_policy_and_frozen_policies_are_only_counted():
    core = multi_core()
    session = core.open_session("p", "tcp")
    plan = core.handle(session, codec.EpisodesAndGetState(episodes=(
        agent_frag("red_1", 2), agent_frag("walker", 3), agent_frag("blue_1", 4, terminated=True),
        agent_frag("x", 1, policy="red")), weights_seq_nos={"red": 5}))
    assert set(plan.records) == {"default", "red"}            # blue is frozen: no records
    assert len(plan.records["red"]) == (2 + 1) + (1 + 1) and len(plan.records["default"]) == 4
    assert (plan.records["red"]["weights_seq_no"] == 5).all()
    assert core.policy_steps == {"default": 3, "red": 3, "blue": 4}
    assert core.policy_stats["blue"].episodes == 1 and core.stats.episodes == 1
    assert set(session.agents) == {"red_1", "walker", "x"}     # open (cut) episodes
    assert plan.wait_for_training


def test_only_frozen_data_does_not_wait_for_training():
    core = multi_core()
    plan = core.handle(core.open_session("p", "tcp"), codec.EpisodesAndGetState(
        episodes=(agent_frag("blue_1", 2),)))
    assert not plan.records and plan.newest_state and not plan.wait_for_training


@pytest.mark.parametrize("episodes, pattern", [
    ((agent_frag("a", 1, policy="nope"),), r"episodes\[0\] \(agent 'a'\): unknown policy 'nope'"),
    ((agent_frag("a", 1, episode="e1", terminated=True), agent_frag("a", 1, episode="e1")),
     r"episodes\[1\] \(agent 'a'\): episode 'e1' already ended"),
    (tuple(agent_frag(f"a{i}", 1) for i in range(5)),
     r"episodes\[4\]: agent 'a4' is one more than server.max_agents_per_connection=4"),
])
def test_bad_agent_input_is_refused_naming_the_agent_and_nothing_is_counted(episodes, pattern):
    core = multi_core()
    session = core.open_session("p", "tcp")
    with pytest.raises(InvalidEpisode, match=pattern):
        core.handle(session, codec.Episodes(episodes=episodes))
    assert core.env_steps == 0 and not session.agents


def test_an_observation_outside_its_policys_space_names_the_agent():
    core = multi_core()
    bad = agent_frag("red_2", 1, start=50.0)   # beyond Box(-10, 10)
    with pytest.raises(InvalidEpisode, match=r"episodes\[0\] \(agent 'red_2'\)\.obs"):
        core.handle(core.open_session("p", "tcp"), codec.Episodes(episodes=(bad,)))


def test_an_ended_episode_id_is_remembered_across_messages_and_agents_stay_within_the_limit():
    core = multi_core(max_agents=2)
    session = core.open_session("p", "tcp")
    core.handle(session, codec.Episodes(episodes=(agent_frag("a", 1, episode="1", terminated=True),)))
    with pytest.raises(InvalidEpisode, match="episode '1' already ended"):
        core.handle(session, codec.Episodes(episodes=(agent_frag("a", 1, episode="1"),)))
    core.handle(session, codec.Episodes(episodes=(agent_frag("a", 1, episode="2"),
                                                  agent_frag("b", 1))))  # two open: the limit
    with pytest.raises(InvalidEpisode, match="agent 'c' is one more"):
        core.handle(session, codec.Episodes(episodes=(agent_frag("c", 1),)))
    core.handle(session, codec.Episodes(episodes=(agent_frag("b", 1, terminated=True),)))
    core.handle(session, codec.Episodes(episodes=(agent_frag("c", 1),)))  # b left: room for c


def test_a_continued_episode_keeps_its_policy():
    core = multi_core()
    session = core.open_session("p", "tcp")
    first = agent_frag("a", 2)                             # cut: continues next message
    core.handle(session, codec.Episodes(episodes=(first,)))
    last_obs = first.obs[-1]
    cont = EpisodeFragment(obs=[last_obs, [0.0, 0.0]], actions=[1], rewards=np.ones(1),
                           is_terminated=True, is_truncated=False, agent_id="a", policy_id="red")
    with pytest.raises(InvalidEpisode, match="continues an episode of policy 'default' with "
                                             "policy 'red'"):
        core.handle(session, codec.Episodes(episodes=(cont,)))


def test_set_config_announces_policies_mapping_and_the_agent_limit():
    reply = decode_reply(multi_core().handle(multi_core().open_session("p", "tcp"), codec.GetConfig()))
    assert set(reply.policies) == {"default", "red", "blue"}
    assert reply.policies["blue"]["trainable"] is False
    assert reply.policy_mapping == [["red_*", "red"], ["blue_*", "blue"]]
    assert reply.max_agents_per_connection == 4


def test_attach_names_a_known_policy_once():
    core = multi_core()
    session = core.open_session("p", "unix")
    assert core.handle(session, codec.Attach(pid=1, policy="red")).attach_policy == "red"
    assert core.handle(session, codec.Attach(pid=1)).attach_policy == "default"
    with pytest.raises(BadMessage, match="already attached for policy 'red'"):
        core.handle(session, codec.Attach(pid=1, policy="red"))
    with pytest.raises(BadMessage, match="unknown policy 'nope'"):
        core.handle(session, codec.Attach(pid=1, policy="nope"))
