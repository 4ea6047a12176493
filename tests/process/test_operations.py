"""Operations with real processes and real signals: checkpoints, resume, supervision."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from rlinkd.daemon.checkpoint import store
from rlinkd.daemon.errors import ExitCode
from tests.helpers import REPO, BackgroundClient, wait_for

pytestmark = pytest.mark.process


def tcp(d) -> str:
    return f"tcp://127.0.0.1:{d.port}"


def test_sigusr1_checkpoints_while_clients_keep_training(daemon):
    client = BackgroundClient(tcp(daemon)).start()
    wait_for(lambda: daemon.status()["weights_seq_no"] >= 2, 60, what="training")
    daemon.signal(signal.SIGUSR1)
    status = wait_for(lambda: (s := daemon.status())["checkpoints_written"] >= 1 and s, 60,
                      what="checkpoint")
    ckpt = store.verify(store.checkpoints_dir(daemon.state_dir) / "ckpt-000001")
    assert status["last_checkpoint"]["path"] == str(ckpt.path)
    assert ckpt.manifest["reason"] == "SIGUSR1"
    steps = status["env_steps"]
    wait_for(lambda: daemon.status()["env_steps"] > steps + 1000, 60, what="training goes on")
    assert client.error is None and client.agent.link.reconnects == 0
    client.stop()


def test_sigterm_under_load_exits_0_with_final_checkpoint(daemon):
    clients = [BackgroundClient(tcp(daemon), seed=i, reconnect_timeout_s=1).start()
               for i in range(2)]
    wait_for(lambda: daemon.status()["weights_seq_no"] >= 3, 60, what="training")
    seq = daemon.status()["weights_seq_no"]
    budget = 30.0  # daemon.shutdown_timeout_s
    code = daemon.stop(timeout_s=budget)
    assert code == 0
    newest = store.latest_valid(store.checkpoints_dir(daemon.state_dir))
    assert newest is not None and newest.manifest["reason"] == "shutdown"
    assert newest.weights_seq_no >= seq
    for c in clients:
        c.stop()
        assert isinstance(c.error, ConnectionError)  # told to go away, could not reconnect


def test_sigterm_whose_final_checkpoint_fails_exits_74_and_says_why(daemon_factory):
    """systemd (``systemctl stop``, then ``status``) must see that the final state was not
    saved: the drain still stops every role and unlinks the segments (the pool checks),
    but the exit code is DRAIN_NO_CHECKPOINT and one error line names the reason."""
    d = daemon_factory(name="f", check_clean_exit=False)
    root = store.checkpoints_dir(d.state_dir)  # a file where the checkpoints go: the write fails
    shutil.rmtree(root, ignore_errors=True)
    root.write_text("not a directory")
    assert d.stop() == ExitCode.DRAIN_NO_CHECKPOINT == 74
    [line] = [json.loads(x) for x in d.log().splitlines() if '"drain_incomplete"' in x]
    assert line["level"] == "error" and line["exit_code"] == 74 and line["killed"] == []
    assert str(root) in line["final_checkpoint"], line  # the checkpointer's own error


def test_restart_resumes_counters_seq_no_and_policy(daemon_factory):
    d = daemon_factory(name="s")
    client = BackgroundClient(tcp(d)).start()
    status = wait_for(lambda: (s := d.status())["episode_return_mean"] and
                      s["episode_return_mean"] >= 120 and s, 120, what="some learning")
    client.stop()
    before = d.status()
    assert d.stop() == 0
    d.proc = None
    d.start()
    after = d.status()
    assert after["env_steps"] == before["env_steps"] and after["episodes"] == before["episodes"]
    assert after["weights_seq_no"] == before["weights_seq_no"]
    probe = BackgroundClient(tcp(d), seed=7).start()
    resumed = wait_for(lambda: (s := d.status())["episodes"] >= before["episodes"] + 20 and s,
                       120, what="episodes after the restart")
    probe.stop()
    assert resumed["episode_return_mean_20"] >= 0.5 * status["episode_return_mean"]
    assert resumed["weights_seq_no"] > before["weights_seq_no"]


def test_periodic_checkpoints_and_fresh_start_sets_them_aside(daemon_factory):
    d = daemon_factory("--set", "checkpoint.checkpoint_interval_s=1.0", name="p")
    client = BackgroundClient(tcp(d)).start()
    wait_for(lambda: (s := d.status())["checkpoints_written"] >= 3
             and s["last_checkpoint"]["weights_seq_no"] >= 1, 60,
             what="three periodic checkpoints without any request, one of trained weights")
    client.stop()
    assert d.stop() == 0
    d.args += ["--fresh"]
    d.proc = None
    d.start()
    fresh = d.status()
    assert fresh["weights_seq_no"] <= 0 and fresh["env_steps"] == 0 and fresh["episodes"] == 0, fresh
    checkpoints = d.state_dir / "checkpoints"
    assert not list(checkpoints.glob("ckpt-*"))                 # set aside, so never resumed,
    assert list(checkpoints.glob("previous-*/ckpt-*"))          # and not deleted


def test_sigkill_learner_is_restarted_and_clients_stay_connected(daemon):
    clients = [BackgroundClient(tcp(daemon)).start(),
               BackgroundClient(f"shm:{daemon.state_dir}", seed=1).start()]
    wait_for(lambda: daemon.status()["weights_seq_no"] >= 2, 60, what="training")
    before = daemon.status()
    old = before["children"]["learner"]["pid"]
    os.kill(old, signal.SIGKILL)
    seen = []  # weights_seq_no never goes backwards across the restart

    def restarted():
        s = daemon.status()
        seen.append(s["weights_seq_no"])
        return s["children"]["learner"]["restarts"] >= 1 and s["children"]["learner"]["alive"] and s
    status = wait_for(restarted, 60, what="learner restart")
    assert status["children"]["learner"]["pid"] != old
    seq = status["weights_seq_no"]
    wait_for(lambda: seen.append(daemon.status()["weights_seq_no"]) or seen[-1] >= seq + 3, 60,
             what="training continues")
    assert seen == sorted(seen) and seen[0] >= before["weights_seq_no"], seen
    assert type(clients[1].agent.link).__name__ == "ShmLink"
    for client in clients:
        assert client.error is None and client.agent.link.reconnects == 0
        client.stop()
    daemon.remember_children()


RED = "[policies.red]\ntrainable = true\n[policies.red.ppo]\nent_coef = 0.0\nlr = "


def test_sighup_applies_a_valid_file_and_ignores_an_invalid_one(daemon_factory, tmp_path):
    """Global keys reach the policies without their own table; policies.red.ppo.lr reaches
    red only; a non-reloadable key of red's table is named as needing a restart."""
    config = tmp_path / "rlinkd.toml"
    config.write_text(f"[ppo]\nlr = 0.001\n{RED}0.003\n")
    d = daemon_factory("--config", str(config))
    assert d.status()["config"]["ppo.lr"] == 0.001
    assert d.status()["config"]["policies.red.ppo.lr"] == 0.003
    config.write_text(f"[ppo]\nlr = 0.0005\nent_coef = 0.01\n{RED}0.004\n")
    d.signal(signal.SIGHUP)
    status = wait_for(lambda: (s := d.status())["reload_generation"] == 1 and s, 30, what="reload")
    assert status["last_reload"]["ok"] is True
    assert status["last_reload"]["needs_restart"] == []  # port 0 (the picked port) is no change
    assert status["last_reload"]["applied"] == {"ppo.lr": 0.0005, "ppo.ent_coef": 0.01,
                                                "policies.red.ppo.lr": 0.004}
    assert status["config"]["ppo.lr"] == 0.0005 and status["config"]["ppo.ent_coef"] == 0.01
    assert status["config"]["policies.red.ppo.lr"] == 0.004
    wait_for(lambda: d.status()["learner"].get("lr") == 0.0005, 30, what="learner applies lr")
    red = wait_for(lambda: (r := d.status()["policies"]["red"]["learner"]).get("lr") == 0.004 and r,
                   30, what="red's learner applies its own lr")
    assert red["ent_coef"] == 0.0                        # [ppo]'s ent_coef skips red's table
    config.write_text("[ppo]\nlr = -1\n")
    d.signal(signal.SIGHUP)
    status = wait_for(lambda: (s := d.status())["reload_generation"] == 2 and s, 30, what="reload")
    assert status["last_reload"]["ok"] is False and "ppo.lr" in status["last_reload"]["error"]
    assert status["config"]["ppo.lr"] == 0.0005 and d.status()["learner"]["lr"] == 0.0005
    config.write_text(f"[ppo]\nlr = 0.0005\nent_coef = 0.02\n{RED}0.004\nhidden_sizes = [8]\n")
    d.signal(signal.SIGHUP)
    status = wait_for(lambda: (s := d.status())["reload_generation"] == 3 and s, 30, what="reload")
    assert status["last_reload"]["ok"] is True
    assert status["last_reload"]["needs_restart"] == ["policies.red.ppo.hidden_sizes"]
    assert status["last_reload"]["applied"] == {"ppo.ent_coef": 0.02}
    assert d.status()["policies"]["red"]["learner"]["lr"] == 0.004


def test_sighup_log_level_reaches_every_process(daemon_factory, tmp_path):
    config = tmp_path / "rlinkd.toml"
    config.write_text('[daemon]\nlog_level = "info"\n')
    d = daemon_factory("--config", str(config))
    booted = ('"learner_ready"', '"connector_ready"', '"checkpointer_ready"')
    wait_for(lambda: all(e in d.log_path.read_text() for e in booted), 30,
             what="every role in its loop")
    config.write_text('[daemon]\nlog_level = "debug"\n')
    d.signal(signal.SIGHUP)

    def roles_set():
        roles = set()  # the whole log: at debug level its tail (d.log()) can scroll past these lines
        for line in d.log_path.read_text(errors="replace").splitlines():
            try:  # the last line may be mid-write
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "log_level_set" and event.get("log_level") == "debug":
                roles.add(event["role"])
        return roles
    every = {"supervisor", "collector", "connector", "learner", "checkpointer"}
    try:
        wait_for(lambda: roles_set() >= every, 30, what="every role applied the new log level")
    except AssertionError:
        raise AssertionError(f"only {sorted(roles_set())} logged log_level_set; status "
                             f"{d.status().get('last_reload')}\n{d.log()[-6000:]}") from None


def test_cli_checkpoint_and_reload_wait_for_the_result(daemon_factory, tmp_path):
    config = tmp_path / "rlinkd.toml"
    config.write_text("[checkpoint]\nkeep_checkpoints = 5\n")
    d = daemon_factory("--config", str(config))
    cli = [sys.executable, "-m", "rlinkd.daemon.cli"]
    out = subprocess.run([*cli, "checkpoint", "--state-dir", str(d.state_dir)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    store.verify(__import__("pathlib").Path(out.stdout.strip()))
    config.write_text("[checkpoint]\nkeep_checkpoints = 2\n")
    out = subprocess.run([*cli, "reload", "--state-dir", str(d.state_dir)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and '"ok": true' in out.stdout, out.stdout + out.stderr
    config.write_text("[checkpoint]\nkeep_checkpoints = zero\n")
    out = subprocess.run([*cli, "reload", "--state-dir", str(d.state_dir)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 78 and '"ok": false' in out.stdout
    status = d.status()
    assert status["last_checkpoint"]["request_id"] == status["signal_checkpoint_request"] > 0
    root = store.checkpoints_dir(d.state_dir)      # a file where the checkpoints go: the write fails
    root.rename(root.with_name("aside"))
    root.write_text("not a directory")
    out = subprocess.run([*cli, "checkpoint", "--state-dir", str(d.state_dir)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 73 and "the checkpoint failed" in out.stderr, out.stdout + out.stderr
    status = d.status()
    assert status["checkpoints_failed"] == 1
    assert status["last_checkpoint_failure"]["request_id"] == status["signal_checkpoint_request"]
    root.unlink()
    root.with_name("aside").rename(root)


def test_unknown_env_id_exits_78_with_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "rlinkd.daemon.cli", "serve", "--port", "0",
                           "--state-dir", str(tmp_path / "state"), "--set", "env.id=NoSuchEnv-v0"],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 78, done.stdout + done.stderr
    assert "NoSuchEnv-v0" in done.stderr and "env.id" in done.stderr, done.stderr
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    assert not (tmp_path / "state" / "daemon.json").exists()


def test_resume_with_other_spaces_is_refused_and_fresh_starts(daemon_factory, tmp_path):
    """A checkpoint records its spaces and network: a config declaring others exits 78 with
    a message naming what differs (never loads the weights into a network they do not fit);
    --fresh starts over."""
    d = daemon_factory(name="spaces")
    d.signal(signal.SIGUSR1)
    wait_for(lambda: d.status()["checkpoints_written"] >= 1, 60, what="a checkpoint")
    assert d.stop() == 0
    serve = [sys.executable, "-m", "rlinkd.daemon.cli", "serve", "--port", "0",
             "--state-dir", str(d.state_dir), "--set", "env.id=Acrobot-v1"]
    done = subprocess.run(serve, capture_output=True, text=True, timeout=120, cwd=REPO,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 78, done.stdout + done.stderr
    assert "trained for different spaces" in done.stderr and "obs_space" in done.stderr, done.stderr
    assert "--fresh" in done.stderr and "Traceback" not in done.stderr, done.stderr
    d.args += ["--set", "env.id=Acrobot-v1", "--fresh"]
    d.proc = None
    d.start()
    assert d.status()["env_steps"] == 0
