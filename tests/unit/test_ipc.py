"""daemon.ipc inboxes with the registered daemon.messages (one process, a real socketpair)."""
from __future__ import annotations

import dataclasses
import time

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
import pytest

from rlinkd.daemon import ipc
from rlinkd.daemon import messages as m
from rlinkd.daemon.ipc import Inbox, InboxFull

STATE = m.LearnerState(lr=0.002, ent_coef=0.0, updates=3, trained_steps=1536, rejected_batches=0)
UPDATE = m.TrainStats(loss=0.5, policy_loss=-0.1, value_loss=1.2, entropy=0.69, approx_kl=0.01,
                      clip_frac=0.1, grad_norm=0.4, explained_variance=None, epochs=10, n_rows=512,
                      update_time_s=0.06, policy_lag_max=1, policy_lag_mean=0.5)
SAMPLES = [
    m.Stop(reason="sigterm"), m.Reload(changes={"ppo.lr": 0.001, "daemon.log_level": "debug"}),
    m.WeightsPublished(seq_no=7, cutoff_ingest_id=1234, learner=STATE, update=UPDATE),
    m.WeightsPublished(seq_no=0, cutoff_ingest_id=-1, learner=STATE, update=None),
    m.ConnectorStats(dropped_episodes=1, dropped_steps=20, batches=3, buffered_steps=5,
                     trained_steps=4096, slot_states=(0, 2)),
    m.DaemonInfo(daemon_pid=1, state="running",
                 children={"learner": m.ChildInfo(pid=2, restarts=0, alive=True, last_exit=None)},
                 last_checkpoint=m.CheckpointInfo(path="/x/ckpt-000001", weights_seq_no=3,
                                                  created_at=1.5),
                 checkpoints_written=1, checkpoints_failed=0, last_checkpoint_failure=None,
                 signal_checkpoint_request=0, undelivered_messages=0, reload_generation=1,
                 last_reload=m.ReloadResult(generation=1, ok=True, at=2.0,
                                            applied={"ppo.lr": 0.01}, needs_restart=("env.id",),
                                            error=""),
                 state_dir="/s", config={"ppo.lr": 0.01, "daemon.log_level": "info"},
                 metrics_url="http://127.0.0.1:9464/metrics"),
    m.Drain(reason="shutdown"),
    m.BatchReady(slot=1), m.SnapshotRequest(request_id=9),
    m.CheckpointRequest(request_id=2, reason="periodic"),
    m.SnapshotReady(request_id=2, generations={"default": 5, "red": 2}, seq_nos={"default": 7}, ok=False, error="boom",
                    counters={"env_steps": 9, "episodes": 1}),
    m.Listening(host="127.0.0.1", port=5555, unix_socket="/run/rlinkd.sock"),
    m.CollectorStatus(env_steps=10, episodes=1, env_steps_per_s=5.0, episode_return_mean=None,
                      episode_len_mean=9.5, weights_seq_no=2, clients=2, dropped_episodes=0,
                      learner=STATE, update=UPDATE),
    m.CheckpointDone(request_id=2, reason="sigusr1", ok=True, path="/x/ckpt-000001", seq_no=7,
                     error=""),
    m.LearnerReady(seq_no=0, resumed_from=""),
    m.InferenceStats(requests=10, actions=9, batches=3, errors=1, lanes_open=2, areas=3,
                     held=("default",), batch_sizes={"<=4": 2, "<=8": 1}, backends={"default": "numpy"},
                     cpu_s=0.5, weights_seq_nos={"default": 3}),
    m.ConnectorLag(policy="default", lag_steps=640),
]


def receiver(msg) -> str:
    return sorted(type(msg).RECEIVERS)[0]


@pytest.fixture
def inbox():
    box = Inbox("learner")  # Stop and BatchReady are addressed to it
    yield box
    box.close()


def test_every_registered_message_has_a_sample():
    assert {type(s).__name__ for s in SAMPLES} == {
        name for name, cls in ipc.registered().items() if cls.__module__ == m.__name__}


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda s: type(s).__name__)
def test_send_recv_round_trip(msg):
    box = Inbox(receiver(msg))
    try:
        box.send(msg)
        got = box.recv(timeout_s=5.0)
    finally:
        box.close()
    assert type(got) is type(msg) and got == msg
    assert dataclasses.is_dataclass(got)


def test_drain_returns_everything_in_order(inbox):
    sent = [s for s in SAMPLES if "learner" in type(s).RECEIVERS]
    assert len(sent) >= 4
    for msg in sent:
        inbox.send(msg)
    assert inbox.drain() == sent
    assert inbox.drain() == []


def test_every_receiver_is_a_role_or_the_supervisor():
    from rlinkd.daemon.wiring import ROLES
    for cls in ipc.registered().values():
        assert cls.RECEIVERS and cls.RECEIVERS <= {*ROLES, "supervisor"}, cls.__name__


def test_send_refuses_a_message_addressed_elsewhere(inbox):
    with pytest.raises(ipc.Misrouted, match="CheckpointRequest is not addressed to inbox 'learner'"):
        inbox.send(m.CheckpointRequest(request_id=1, reason="x"))
    assert inbox.recv(timeout_s=0) is None


def test_blocking_recv_gets_a_waiting_message(inbox):
    inbox.send(m.BatchReady(slot=0))
    assert inbox.recv() == m.BatchReady(slot=0)   # timeout None: blocks, but data is there


def test_recv_timeout_returns_none(inbox):
    start = time.monotonic()
    assert inbox.recv(timeout_s=0.05) is None
    assert time.monotonic() - start >= 0.045
    assert inbox.recv(timeout_s=0) is None and inbox.recv(timeout_s=-1) is None


def test_messages_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.Stop(reason="x").reason = "y"  # type: ignore[misc]


def test_inbox_full_when_nobody_reads(inbox):
    sent = 0
    while inbox.try_send(m.BatchReady(slot=sent)):
        sent += 1
        assert sent < 1_000_000, "inbox never filled up"
    assert sent > 0
    start = time.monotonic()
    with pytest.raises(InboxFull, match="inbox learner is full"):
        inbox.send(m.BatchReady(slot=-1), timeout_s=0.05)
    assert time.monotonic() - start >= 0.045
    with pytest.raises(InboxFull):
        inbox.send(m.BatchReady(slot=-1), timeout_s=0)
    assert issubclass(InboxFull, TimeoutError)
    # nothing was lost or duplicated, and reading makes room again
    received = inbox.drain()
    assert [r.slot for r in received] == list(range(sent))
    inbox.send(m.BatchReady(slot=-2), timeout_s=1.0)
    assert inbox.recv(timeout_s=1.0) == m.BatchReady(slot=-2)


def test_encode_decode_directly():
    data = ipc.encode(m.Listening(host="::1", port=0, unix_socket="s"))
    assert b'"kind":"Listening"' in data
    assert ipc.decode(data) == m.Listening(host="::1", port=0, unix_socket="s")


def _body(msg, **changes) -> bytes:
    body = orjson.loads(ipc.encode(msg))
    body.update(changes)
    return orjson.dumps(body)


@pytest.mark.parametrize("data, error", [
    (b'{"kind": "NoSuchMessage"}', "undecodable"),
    (b"not json", "undecodable"),
    (b'[1, 2]', "undecodable"),
    (_body(m.BatchReady(slot=1), slot="1"), r"BatchReady.slot: '1' is not int"),
    (_body(m.BatchReady(slot=1), slot=True), r"BatchReady.slot: True is not int"),
    (_body(m.BatchReady(slot=1), slot=1.5), r"BatchReady.slot: 1.5 is not int"),
    (_body(m.BatchReady(slot=1), extra=1), r"BatchReady: fields \['extra', 'policy', 'slot'\]"),
    (b'{"kind": "BatchReady"}', r"BatchReady: fields \[\], declared \['policy', 'slot'\]"),
    (_body(SAMPLES[2], learner={"lr": 1.0}), r"WeightsPublished.learner: fields"),
    (_body(SAMPLES[2], update=[1, 2]), r"WeightsPublished.update: .* fits none"),
    (_body(SAMPLES[5], children={"learner": {"pid": "x", "restarts": 0, "alive": True,
                                             "last_exit": None}}),
     r"DaemonInfo.children\['learner'\].pid"),
    (_body(SAMPLES[1], changes={"ppo.gamma": 0.5}), r"Reload: ppo.gamma: not a reloadable"),
    (_body(SAMPLES[1], changes={"ppo.lr": -1.0}), r"Reload: ppo.lr: must be >= 0"),
    (_body(SAMPLES[1], changes={"daemon.log_level": "loud"}), r"must be one of"),
    (_body(SAMPLES[1], changes={"checkpoint.keep_checkpoints": 2.5}), r"expected int"),
])
def test_decode_validates_every_field(data, error):
    with pytest.raises(ipc.BadMessage, match=error):
        ipc.decode(data)


def test_floats_accept_ints_and_nan_travels_as_none():
    got = ipc.decode(_body(SAMPLES[2], update=dict(dataclasses.asdict(UPDATE), loss=1)))
    assert got.update.loss == 1.0 and isinstance(got.update.loss, float)
    assert ipc.decode(ipc.encode(SAMPLES[2])).update.explained_variance is None


def test_router_dispatches_by_type_and_honours_ignores():
    seen = []
    route = m.Router("learner", {m.SnapshotRequest: lambda msg: seen.append(msg.request_id),
                                 m.Reload: seen.append, m.Stop: lambda msg: seen.append(msg.reason)},
                     ignore=(m.BatchReady,))
    route(m.SnapshotRequest(request_id=3))
    route(m.Stop(reason="r"))
    assert route(m.BatchReady(slot=1)) is None
    assert seen == [3, "r"]
    with pytest.raises(ipc.Misrouted, match="learner got Drain, not addressed to it"):
        route(m.Drain(reason="x"))


@pytest.mark.parametrize("handlers, ignore, error", [
    ({m.Stop: print, m.Reload: print}, (), r"unhandled.*SnapshotRequest"),
    ({m.Stop: print, m.Reload: print, m.SnapshotRequest: print, m.Drain: print}, (m.BatchReady,),
     r"not addressed here.*Drain"),
    ({m.Stop: print, m.Reload: print, m.SnapshotRequest: print, m.BatchReady: print},
     (m.BatchReady,), r"both handled and ignored.*BatchReady"),
])
def test_router_refuses_an_incomplete_or_wrong_table(handlers, ignore, error):
    with pytest.raises(ipc.Misrouted, match=error):
        m.Router("learner", handlers, ignore)


def test_reload_refuses_unknown_or_mistyped_keys_at_construction():
    from rlinkd.daemon.errors import ConfigError
    with pytest.raises(ConfigError, match=r"ppo\.lrr: not a reloadable"):
        m.Reload(changes={"ppo.lrr": 0.1})
    with pytest.raises(ConfigError, match=r"ppo\.lr"):
        m.Reload(changes={"ppo.lr": "fast"})


def test_fileno_is_the_receiving_end(inbox):
    import select
    assert select.select([inbox.fileno()], [], [], 0)[0] == []
    inbox.send(m.Stop(reason="x"))
    assert select.select([inbox.fileno()], [], [], 1.0)[0] == [inbox.fileno()]


def test_only_frozen_dataclasses_can_be_messages():
    import dataclasses as dc

    class Plain:
        pass

    @dc.dataclass
    class Mutable:
        x: int

    for cls in (Plain, Mutable):
        with pytest.raises(TypeError, match="must be a frozen dataclass"):
            ipc.message(to="learner")(cls)
    assert "Plain" not in ipc.registered() and "Mutable" not in ipc.registered()


def test_train_stats_turn_non_finite_measurements_into_none_and_travel():
    raw = {"loss": float("inf"), "policy_loss": -0.1, "value_loss": float("nan"), "entropy": 0.6,
           "approx_kl": 0.0, "clip_frac": 0.0, "grad_norm": 1e39, "explained_variance": float("nan"),
           "epochs": 10.0, "n_rows": 512.0, "update_time_s": 0.05}
    stats = m.train_stats(raw, None, None)
    assert stats.loss is None and stats.value_loss is None and stats.explained_variance is None
    assert stats.grad_norm == 1e39 and stats.epochs == 10 and isinstance(stats.epochs, int)
    msg = m.WeightsPublished(seq_no=1, cutoff_ingest_id=5, learner=STATE, update=stats)
    assert ipc.decode(ipc.encode(msg)) == msg


def test_a_bad_inbox_message_ends_the_collector_instead_of_vanishing():
    """asyncio only logs exceptions of reader callbacks; the collector hands them to its
    fatal-failure path (exit CRASH, restarted) so a lost WeightsPublished cannot strand clients."""
    from types import SimpleNamespace

    from rlinkd.daemon.collector.process import CollectorProcess
    from rlinkd.daemon.collector.server import Background

    class Inbox:
        def drain(self):
            return [m.BatchReady(slot=1)]  # addressed to the learner
    shell = SimpleNamespace(ctx=SimpleNamespace(inbox=Inbox()),
                            route=m.Router("collector", {cls: print for cls in m.addressed_to("collector")}),
                            server=SimpleNamespace(background=Background()))
    CollectorProcess._on_inbox(shell)
    assert isinstance(shell.server.background.fatal, ipc.Misrouted)
    assert shell.server.background.failed.is_set()


# JSON values a corrupted or hostile inbox body might hold in any field.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8)


def mutate(node, data):
    """Replace, drop or add one value somewhere in a decoded JSON body (nested included)."""
    keys = sorted(node) if isinstance(node, dict) else range(len(node))
    key = data.draw(st.sampled_from(list(keys)) | st.text(max_size=8) if isinstance(node, dict)
                    else st.sampled_from(list(keys)), label="key") if len(keys) else None
    child = node.get(key) if isinstance(node, dict) else (node[key] if key is not None else None)
    if isinstance(child, (dict, list)) and child and data.draw(st.booleans(), label="descend"):
        return mutate(child, data)
    if key is None:
        return None
    if isinstance(node, dict) and data.draw(st.booleans(), label="drop"):
        node.pop(key, None)
    else:
        node[key] = data.draw(json_values, label="value")
    return None


@settings(max_examples=600, deadline=None)
@given(sample=st.sampled_from(SAMPLES), data=st.data())
def test_decode_of_a_mutated_body_is_a_message_or_bad_message(sample, data):
    body = orjson.loads(ipc.encode(sample))
    mutate(body, data)
    try:
        got = ipc.decode(orjson.dumps(body))
    except ipc.BadMessage:
        return
    assert type(got) in ipc.registered().values()
    assert ipc.decode(ipc.encode(got)) == got  # whatever passed is a well-formed message


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=64))
def test_decode_of_random_bytes_is_bad_message(data):
    try:
        got = ipc.decode(data)
    except ipc.BadMessage:
        return
    assert type(got) in ipc.registered().values()
