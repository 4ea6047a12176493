"""Tier 1: a recurrent policy's state as training data -- the fragment state grid on the wire
(RLlink "state_in"), in step records (HAS_STATE rows) and the collector's checks of both
transports (TCP fragments, shared-memory ring records): ERROR to that client only."""
from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from rlinkd.client_lib.links import server_config
from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol.codec import EpisodeFragment
from rlinkd.client_lib.protocol.compact import encode_compact
from rlinkd.client_lib.protocol.fragments import Fragment, from_wire
from rlinkd.client_lib.protocol.records import fragment_records, read_state
from rlinkd.client_lib.protocol.recurrent import state_contract
from rlinkd.client_lib.protocol.spaces import Box, Discrete
from rlinkd.client_lib.transport import RLlinkError
from rlinkd.daemon.collector.core import CollectorCore, single_policy
from rlinkd.daemon.collector.ingest import (InvalidEpisode, Limits, PolicyInfo, Spaces,
                                            validate_fragment)
from rlinkd.daemon.collector.shm_clients import ShmClients
from rlinkd.daemon.config import load_config
from rlinkd.shm.records import FINAL_OBS, HAS_STATE, TERMINATED, StepLayout
from tests.process.test_fuzz_shm import client_side

OBS, ACT = Box([2], low=-10.0, high=10.0), Discrete(3)
S, L = 4, 3                                     # state width, max_seq_len
RNN = Spaces(OBS, ACT, dist_size=3, state_size=S, max_seq_len=L)
FF = Spaces(OBS, ACT, dist_size=3)
RNN_LAYOUT, FF_LAYOUT = StepLayout.flat(2, 1, 3, state_size=S), StepLayout.flat(2, 1, 3)
LIMITS = Limits(max_episode_steps=1000, max_obs_floats=1000)


def states(rows: int) -> np.ndarray:
    return (np.arange(rows * S, dtype=np.float32).reshape(rows, S) + 1) / 8


def wire_fragment(t: int, state_in=None) -> EpisodeFragment:
    obs = np.arange((t + 1) * 2, dtype=np.float64).reshape(t + 1, 2) / 10
    return EpisodeFragment(obs=obs.tolist(), actions=(np.arange(t) % 3).tolist(),
                           rewards=np.ones(t), is_terminated=True, is_truncated=False,
                           state_in=state_in)


# ---------------------------------------------------------------- the wire
@pytest.mark.parametrize("form", ["list", "compact"])
def test_state_in_travels_in_an_rllink_fragment_as_a_list_or_compact(form):
    rows = states(3)
    sent = rows.tolist() if form == "list" else encode_compact(rows)
    body = codec.encode_body({"type": "EPISODES", "episodes": [
        {**wire_fragment(7).to_json(), "state_in": sent}]})
    got = codec.decode_body(body[8:]).episodes[0]
    np.testing.assert_array_equal(got.state_in, rows)


def test_fragment_to_wire_and_back_keeps_the_state_rows():
    frag = validate_fragment(wire_fragment(7, states(3)), RNN, LIMITS, "e")
    back = from_wire(codec.decode_body(codec.encode(codec.Episodes(
        episodes=(frag.to_wire(OBS, ACT, compact=True),)))[8:]).episodes[0], OBS, ACT, "e")
    np.testing.assert_array_equal(back.state_in, states(3))
    assert validate_fragment(wire_fragment(7), FF, LIMITS, "e").to_wire(OBS, ACT, False).state_in is None
    wide = Spaces(OBS, ACT, dist_size=3, state_size=128, max_seq_len=L)  # 1.5 KB: compact
    rows = np.random.default_rng(0).normal(size=(3, 128)).astype(np.float32)
    sent = validate_fragment(wire_fragment(7, rows), wide, LIMITS, "e").to_wire(OBS, ACT, compact=True)
    assert "b64" in sent.state_in
    got = codec.decode_body(codec.encode(codec.Episodes(episodes=(sent,)))[8:]).episodes[0]
    np.testing.assert_array_equal(validate_fragment(got, wide, LIMITS, "e").state_in, rows)
    assert "state_in" not in wire_fragment(7).to_json()       # feed-forward: nothing new


def test_set_config_and_attached_state_keys_are_optional():
    contract = {"cell": "gru", "shape": ["batch", 4]}
    msg = codec.SetConfig(env_steps_per_sample=5, force_on_policy=True, state=contract)
    assert codec.decode_body(codec.encode(msg)[8:]).state == contract
    assert "state" not in codec.SetConfig(env_steps_per_sample=5, force_on_policy=True).to_body()


# ---------------------------------------------------------------- records
@pytest.mark.parametrize("t", [1, 3, 7])
def test_fragment_records_write_the_state_on_the_grid_rows_only(t):
    k = -(-t // L)
    frag = validate_fragment(wire_fragment(t, states(k)), RNN, LIMITS, "e")
    rec = fragment_records(frag, RNN_LAYOUT, max_seq_len=L)
    flagged = np.flatnonzero(rec["flags"] & HAS_STATE)
    assert flagged.tolist() == list(range(0, t, L))          # 0, L, 2L, ... below T
    np.testing.assert_array_equal(rec["state"][flagged], states(k))
    assert not rec["state"][np.setdiff1d(np.arange(t + 1), flagged)].any()
    np.testing.assert_array_equal(read_state(rec), states(k))


def test_feed_forward_records_have_no_state_field():
    frag = validate_fragment(wire_fragment(4), FF, LIMITS, "e")
    rec = fragment_records(frag, FF_LAYOUT)
    assert "state" not in rec.dtype.names and not (rec["flags"] & HAS_STATE).any()


def test_fragment_records_refuse_a_recurrent_fragment_without_its_state():
    frag = Fragment({"obs": np.zeros((3, 2), np.float32)}, np.zeros((2, 1), np.float32),
                    np.ones(2), True, False)
    with pytest.raises(ValueError, match="state_in rows"):
        fragment_records(frag, RNN_LAYOUT, max_seq_len=L)


# ---------------------------------------------------------------- the collector, TCP
BAD_TCP = {
    "missing for a recurrent policy": (RNN, None, "state_in .*is required"),
    "sent to a feed-forward policy": (FF, states(3), "feed-forward"),
    "too few rows": (RNN, states(2), r"shape \(2, 4\), expected \(3, 4\)"),
    "too narrow": (RNN, states(3)[:, :3], r"expected \(3, 4\)"),
    "NaN": (RNN, np.where(np.eye(3, S) > 0, np.nan, states(3)), "NaN"),
    "inf": (RNN, np.full((3, S), np.inf), "NaN or inf"),
}


@pytest.mark.parametrize("case", BAD_TCP)
def test_the_collector_refuses_a_bad_state(case):
    spaces, state_in, message = BAD_TCP[case]
    with pytest.raises(InvalidEpisode, match=message):
        validate_fragment(wire_fragment(7, state_in), spaces, LIMITS, "episodes[0]")


def test_a_bad_state_over_tcp_is_that_clients_error_and_nothing_is_ingested():
    core = CollectorCore(load_config(resolve_dirs=False), single_policy(RNN, RNN_LAYOUT))
    bad, good = core.open_session("bad", "tcp"), core.open_session("good", "tcp")
    with pytest.raises(codec.BadMessage, match="state_in"):
        core.handle(bad, codec.Episodes(episodes=(wire_fragment(7, states(2)),)))
    plan = core.handle(good, codec.Episodes(episodes=(wire_fragment(7, states(3)),)))
    rec = plan.records["default"]
    assert core.env_steps == 7 and np.flatnonzero(rec["flags"] & HAS_STATE).tolist() == [0, 3, 6]


# ---------------------------------------------------------------- the collector, shared memory
def ring_clients(spaces: Spaces, layout: StepLayout) -> ShmClients:
    c = ShmClients("rnn", single_policy(spaces, layout), 8, itertools.count(100).__next__)
    c.attach(1, 7, "default", 1024)
    return c


def ring_records(layout: StepLayout, t: int, flagged: list[int], slot: int = 0) -> np.ndarray:
    rec = layout.empty(t + 1)
    rec["stream_id"] = slot
    rec["flags"][t] = FINAL_OBS | TERMINATED
    if flagged:
        rec["flags"][flagged] |= HAS_STATE
        rec["state"][flagged] = 0.5
    return rec


def write_and_read(c: ShmClients, rec: np.ndarray) -> np.ndarray:
    producer = client_side(c.sessions[1].rings["default"].ring)
    producer.write_batch(rec)
    producer.close()
    return c.read(1, "default", 1 << 14)


def test_ring_records_on_the_grid_pass_also_across_reads_and_agent_slots():
    c = ring_clients(RNN, RNN_LAYOUT)
    rec = ring_records(RNN_LAYOUT, 7, [0, 3, 6])
    assert len(write_and_read(c, rec[:4])) == 4                  # a fragment read in two parts
    assert len(write_and_read(c, rec[4:])) == 4
    two = np.concatenate([ring_records(RNN_LAYOUT, 4, [0, 3], slot=1)[:2],
                          ring_records(RNN_LAYOUT, 2, [0], slot=2),
                          ring_records(RNN_LAYOUT, 4, [0, 3], slot=1)[2:]])
    assert len(write_and_read(c, two.astype(RNN_LAYOUT.dtype))) == 8
    c.close()


BAD_RING = {
    "a grid row unflagged": (RNN, RNN_LAYOUT, [0, 6], None, "state grid"),
    "an off-grid row flagged": (RNN, RNN_LAYOUT, [0, 2, 3, 6], None, "state grid"),
    "the final record flagged": (RNN, RNN_LAYOUT, [0, 3, 6, 7], None, "state grid"),
    "NaN state": (RNN, RNN_LAYOUT, [0, 3, 6], np.nan, "state contains NaN"),
    "state flag, feed-forward": (FF, FF_LAYOUT, [0], None, "unknown or reserved flags"),
}


@pytest.mark.parametrize("case", BAD_RING)
def test_ring_records_off_the_state_grid_refuse_that_client(case):
    spaces, layout, flagged, value, message = BAD_RING[case]
    c = ring_clients(spaces, layout)
    rec = ring_records(layout, 7, flagged if spaces is RNN else [])
    if spaces is FF:
        rec["flags"][flagged] |= HAS_STATE
    if value is not None:
        rec["state"][3, 1] = value
    with pytest.raises(InvalidEpisode, match=message):
        write_and_read(c, rec)
    assert c.sessions[1].refused and not c.readable()
    c.close()


def test_set_config_announces_a_recurrent_policys_state_and_client_lib_reads_it():
    contract = state_contract("gru", S, L)
    policies = {"default": PolicyInfo(RNN, RNN_LAYOUT, state=contract),
                "plain": PolicyInfo(FF, FF_LAYOUT)}
    core = CollectorCore(load_config(resolve_dirs=False), policies)
    reply = codec.decode_body(core.handle(core.open_session("p", "tcp"), codec.GetConfig()).reply[8:])
    assert reply.state == contract and reply.policies["default"]["state"] == contract
    assert "state" not in reply.policies["plain"]
    cfg = server_config(reply)
    assert cfg.policies["default"].max_seq_len == L and cfg.policies["plain"].max_seq_len == 0
    with pytest.raises(RLlinkError, match="malformed state"):
        server_config(replace(reply, state={"cell": "gru"}, policies=None))
