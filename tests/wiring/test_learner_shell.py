"""Tier 2: the learner's process shell on a real topology (shared-memory slots and board,
real inboxes), driven by hand from the test thread."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rlinkd.daemon import messages as m
from rlinkd.daemon.batch_schema import BatchMeta, write_columns
from rlinkd.daemon.config import load_config
from rlinkd.daemon.learner.process import LearnerShell
from rlinkd.daemon.roles import RoleContext
from rlinkd.daemon.wiring import build_topology, destroy_topology

ROWS, MINIBATCH, EPOCHS = 64, 16, 3


@pytest.fixture
def shell(tmp_path):
    cfg = load_config(None, [("daemon", "state_dir", str(tmp_path / "state")),
                             ("sampling", "train_batch_size", ROWS),
                             ("ppo", "minibatch_size", MINIBATCH), ("ppo", "num_epochs", EPOCHS),
                             ("ppo", "lr", 0.01), ("ppo", "ent_coef", 0.02)])
    topo = build_topology(cfg)
    ctx = RoleContext("learner", topo)
    ctx.beats = 0

    def counting_heartbeat() -> None:
        ctx.beats += 1
        RoleContext.heartbeat(ctx)
    ctx.heartbeat = counting_heartbeat
    shell = LearnerShell(topo, ctx)
    yield shell
    shell.close()
    destroy_topology(topo)


def ready_batch(shell: LearnerShell, behaviour: int) -> None:
    """What the connector does: a CartPole batch collected with version ``behaviour``."""
    spec, rng = shell.topo.default.spec, np.random.default_rng(0)
    obs = rng.uniform(-0.2, 0.2, (ROWS, spec.obs_size)).astype(np.float32)  # inside CartPole bounds
    actions = rng.integers(0, 2, (ROWS, 1)).astype(np.float32)  # index vectors
    flat = shell.default.learner.flat_weights()
    values = spec.value_forward(flat, obs)
    batch = {"obs": {"": obs}, "actions": actions, "values": values,
             "logp": spec.log_prob(spec.actor_forward(flat, obs), actions),
             "advantages": rng.normal(size=ROWS).astype(np.float32),
             "value_targets": values + 1.0}
    slot = shell.default.slots.acquire_free()
    rows = write_columns(shell.default.slots.columns(slot), batch, spec)
    shell.default.slots.mark_ready(slot, rows, BatchMeta(
        ingest_cutoff=ROWS, episodes=1, dropped_episodes=0, values_seq_no=behaviour,
        behaviour_min=behaviour, behaviour_sum=behaviour * ROWS, behaviour_steps=ROWS).as_slot_meta())


def collector_messages(shell: LearnerShell) -> list:
    return shell.topo.inboxes["collector"].drain()


def test_boot_reports_the_hparams_it_trains_with(shell):
    shell.boot()
    (published,) = collector_messages(shell)
    assert (published.learner.lr, published.learner.ent_coef) == (0.01, 0.02)
    assert not published.trained and published.update is None
    expected = ("cuda:0", "measured") if torch.cuda.is_available() else ("cpu", "only_cpu")
    assert (published.learner.device, published.learner.device_choice) == expected


def test_one_batch_heartbeats_every_minibatch_step_and_lag_is_against_trained_from(shell):
    shell.boot()
    collector_messages(shell)
    ready_batch(shell, behaviour=0)  # on-policy: collected with the weights trained from
    beats = shell.ctx.beats
    assert shell.train_one()
    (published,) = collector_messages(shell)
    assert published.trained and published.seq_no == 1 and published.cutoff_ingest_id == ROWS
    assert shell.ctx.beats - beats >= EPOCHS * ROWS // MINIBATCH
    assert published.update.policy_lag_max == 0 and published.update.policy_lag_mean == 0
    assert published.learner.lr == 0.01 and published.learner.updates == 1


def test_reload_changes_what_the_next_batch_trains_with(shell):
    shell.boot()
    handle = shell.router()
    handle(m.BatchReady(0))  # a doorbell: nothing to do
    handle(m.Reload({"ppo.lr": 0.005}))
    reported = collector_messages(shell)[-1].learner
    assert (reported.lr, reported.ent_coef) == (0.005, 0.02)
    assert shell.default.learner.optimizer.param_groups[0]["lr"] == 0.005


def test_a_snapshot_carries_the_counters_read_with_it(shell):
    """The collector's counters travel with the snapshot, read when the state was serialised:
    ones counted after it (before the checkpointer writes) belong to newer weights."""
    shell.boot()
    shell.topo.write_counters({"env_steps": 640, "episodes": 3})
    shell.on_snapshot_request(m.SnapshotRequest(4))
    shell.topo.write_counters({"env_steps": 704, "episodes": 4})  # the collector goes on
    (ready,) = [msg for msg in shell.topo.inboxes["checkpointer"].drain()
                if isinstance(msg, m.SnapshotReady)]
    assert ready.ok and ready.request_id == 4 and ready.seq_nos == {"default": shell.seq_no}
    assert ready.counters == {"env_steps": 640, "episodes": 3}


def test_a_dqn_learner_trains_from_the_replay_and_a_successor_keeps_its_buffer(tmp_path):
    """The replay buffer lives outside the learner: a DQN shell trains from what the
    connector wrote, publishes, and a second shell on the same topology (a restarted
    learner, no checkpoint) finds the buffer full and epsilon where the data put it."""
    from rlinkd.shm.replay import ReplayBuffer, ReplayLayout
    from tests.unit.test_replay import rows_for
    cfg = load_config(None, [("daemon", "state_dir", str(tmp_path / "state")),
                             ("learner", "algorithm", "dqn"), ("dqn", "learning_starts_steps", 100),
                             ("dqn", "updates_per_step", 0.5), ("dqn", "publish_interval_updates", 10),
                             ("dqn", "epsilon_decay_steps", 1000), ("dqn", "hidden_sizes", [16])])
    topo = build_topology(cfg)
    try:
        policy = topo.default
        replay = ReplayBuffer.attach(policy.replay_path, ReplayLayout(policy.layout))
        first = LearnerShell(topo, RoleContext("learner", topo))
        first.boot()
        rows = rows_for(replay.layout, np.arange(400))
        rows["obs"]["obs"] = rows["next_obs"]["obs"] = 0.01  # inside CartPole's space
        rows["action"] = 1.0
        replay.append(rows[:100])  # learning starts here: the ratio counts from this point
        assert not first.train_one()
        replay.append(rows[100:])
        while first.train_one():
            pass
        learner = first.default
        assert learner.core.updates == 150 and learner.seq_no == 15  # (400 - 100) * 0.5, every 10
        assert learner.core.epsilon < 1.0
        first.close()
        second = LearnerShell(topo, RoleContext("learner", topo))
        second.boot()
        assert len(second.default.replay) == 400 and second.default.seq_no == 15
        assert second.default.core.env_steps == 400  # epsilon goes on
        second.close()
        replay.close()
    finally:
        destroy_topology(topo)


def test_a_reload_of_a_policys_own_table_reaches_that_policy_only(tmp_path):
    """policies.red.ppo.lr: red's optimizer and red's definition in the supervisor's
    topology (what a restarted learner trains with) change; default's do not, and a global
    ppo.lr skips red (its own table holds lr)."""
    from rlinkd.daemon.config import apply_changes
    from rlinkd.daemon.wiring import reconfigured
    cfg = load_config(None, [("daemon", "state_dir", str(tmp_path / "state")),
                             ("sampling", "train_batch_size", ROWS), ("ppo", "minibatch_size", MINIBATCH),
                             ("ppo", "lr", 0.01), ("policies", "red.trainable", True),
                             ("policies", "red.ppo.lr", 0.03)])
    topo = build_topology(cfg)
    shell = LearnerShell(topo, RoleContext("learner", topo))
    try:
        shell.boot()
        changes = {"policies.red.ppo.lr": 0.004}
        shell.router()(m.Reload(changes))
        lr = {name: p.learner.optimizer.param_groups[0]["lr"] for name, p in shell.policies.items()}
        assert lr == {"default": 0.01, "red": 0.004}
        reported = {msg.policy: msg.learner.lr for msg in collector_messages(shell)
                    if isinstance(msg, m.WeightsPublished)}
        assert reported["red"] == 0.004
        after = reconfigured(topo, apply_changes(cfg, changes), changes)
        assert (after.policies["red"].definition.ppo.lr, after.default.definition.ppo.lr) == (0.004, 0.01)
        shell.router()(m.Reload({"ppo.lr": 0.002}))
        lr = {name: p.learner.optimizer.param_groups[0]["lr"] for name, p in shell.policies.items()}
        assert lr == {"default": 0.002, "red": 0.004}
    finally:
        shell.close()
        destroy_topology(topo)
