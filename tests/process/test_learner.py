"""The learner as a real process: long updates are not hangs; a restart keeps the config's
hyperparameters (the checkpoint restores state only)."""
from __future__ import annotations

import os
import signal

import pytest

from tests.helpers import BackgroundClient, wait_for

pytestmark = pytest.mark.process
HEARTBEAT_TIMEOUT_S = 2.0


def tcp(d) -> str:
    return f"tcp://127.0.0.1:{d.port}"


@pytest.mark.serial
def test_an_update_longer_than_the_heartbeat_timeout_is_not_a_hang(daemon_factory):
    # one on-policy batch of 256 rows, 32 minibatches x 200 epochs: several seconds of SGD
    d = daemon_factory("--set", f"daemon.heartbeat_timeout_s={HEARTBEAT_TIMEOUT_S}",
                       "--set", "sampling.env_steps_per_sample=256",
                       "--set", "sampling.train_batch_size=256",
                       "--set", "ppo.minibatch_size=8", "--set", "ppo.num_epochs=200")
    client = BackgroundClient(tcp(d)).start()

    def trained_or_restarted() -> dict | None:
        s = d.status()
        learner = s["children"]["learner"]
        return (s["weights_seq_no"] >= 1 or learner["restarts"] > 0 or not learner["alive"]) and s
    status = wait_for(trained_or_restarted, 120, what="the first long update or a restart")
    client.stop()
    assert status["children"]["learner"]["restarts"] == 0, status["children"]["learner"]
    assert '"event": "child_hung"' not in d.log()
    assert status["learner"]["update_time_s"] > 1.5 * HEARTBEAT_TIMEOUT_S, status["learner"]
    d.remember_children()


def test_restarted_learner_trains_with_the_reloaded_lr_not_the_checkpoints(daemon_factory,
                                                                          tmp_path):
    config = tmp_path / "rlinkd.toml"
    config.write_text("[ppo]\nlr = 0.001\n")
    d = daemon_factory("--config", str(config))
    client = BackgroundClient(tcp(d)).start()
    wait_for(lambda: d.status()["weights_seq_no"] >= 2, 60, what="training")
    d.signal(signal.SIGUSR1)  # a checkpoint saved with lr 0.001, ent_coef 0
    wait_for(lambda: d.status()["checkpoints_written"] >= 1, 60, what="checkpoint")
    config.write_text("[ppo]\nlr = 0.0005\nent_coef = 0.01\n")
    d.signal(signal.SIGHUP)
    wait_for(lambda: d.status()["learner"].get("lr") == 0.0005, 30, what="learner applies lr")
    old = d.status()["children"]["learner"]["pid"]
    os.kill(old, signal.SIGKILL)

    def restarted() -> dict | None:
        s = d.status()
        learner = s["children"]["learner"]
        return learner["restarts"] >= 1 and learner["alive"] and learner["pid"] != old and s
    seq = wait_for(restarted, 60, what="learner restart")["weights_seq_no"]
    trained = wait_for(lambda: (s := d.status())["weights_seq_no"] >= seq + 2 and s, 60,
                       what="batches trained by the restarted learner")
    client.stop()
    assert trained["learner"]["lr"] == 0.0005 and trained["learner"]["ent_coef"] == 0.01
    (line,) = [x for x in d.log().splitlines() if '"event": "hparams_from_config"' in x]
    assert '"checkpoint_lr": 0.001' in line and '"lr": 0.0005' in line, line
    d.remember_children()
