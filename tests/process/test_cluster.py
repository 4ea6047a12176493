"""Jobs of two daemons on loopback (gloo): one training job, the same weights on both ranks.

One test walks a job through its faults and checkpoints, each check on the state the last
left, with short cluster timeouts (``FAST``), so the file costs few daemon starts. Rank 1,
without clients, joins every update with no rows after ``cluster.peer_wait_s`` and must not
stall rank 0; both ranks publish the same ``weights_seq_no`` and weights (status
learner.cluster.weights_digest); a rank SIGKILLed is left out within the bound and rejoins
with the job's weights; without rank 0 a rank serves its last weights; rank 0 alone writes
checkpoints; a job's checkpoint resumes a daemon alone, whose checkpoint starts a job.
Bad cluster configs exit 78 naming the key (three daemons launched together)."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from rlinkd.daemon.checkpoint.store import checkpoints_dir, list_checkpoints
from tests.conftest import DaemonPool
from tests.helpers import BackgroundClient, DaemonProcess, REPO, free_port, wait_for

pytestmark = pytest.mark.process
SMALL_UPDATES = ("--set", "sampling.train_batch_size=128", "--set", "sampling.env_steps_per_sample=128",
                 "--set", "ppo.minibatch_size=64", "--set", "ppo.num_epochs=2")
FAST = ("--set", "cluster.collective_timeout_s=5", "--set", "cluster.peer_wait_s=0.2",
        "--set", "cluster.reform_window_s=0.5")
"""Short cluster timeouts: a killed peer's sockets close at once, so only a start that lags
by more than the collective timeout could fail; 5 s is ample on a loaded box."""



def job_of_two(tmp_path, pool: DaemonPool, *extra: str, dirs=None) -> list[DaemonProcess]:
    """Launch rank 0 and rank 1 at once (each one's learner waits for the other), then wait
    until both are ready (and have joined: their first publication is the job's)."""
    master = f"127.0.0.1:{free_port()}"
    ranks = []
    for rank in (0, 1):
        d = DaemonProcess(dirs[rank] if dirs else tmp_path / f"rank{rank}", [
            "--set", "cluster.world_size=2", "--set", f"cluster.rank={rank}",
            "--set", f"cluster.master={master}", *FAST, *SMALL_UPDATES, *extra])
        d.check_clean_exit = True
        pool.started.append(d)
        ranks.append(d.launch())
    for d in ranks:
        d.wait_ready(60)
        d.remember_children()
    for d in ranks:
        wait_for(lambda d=d: cluster_of(d).get("members") == [0, 1], 60, what="the job formed")
    return ranks


def restart(pool: DaemonPool, d: DaemonProcess) -> DaemonProcess:
    """The same daemon (state dir, arguments) started again."""
    again = DaemonProcess(d.state_dir, d.args)
    again.check_clean_exit = True
    pool.started.append(again)
    again.launch().wait_ready(60)
    again.remember_children()
    return again


def cluster_of(d: DaemonProcess) -> dict:
    return d.status()["learner"].get("cluster") or {}


def in_step(*ranks: DaemonProcess) -> list[dict] | None:
    """Every rank's status when all are members of one job at the same weights_seq_no and
    weights; else None."""
    statuses = [d.status() for d in ranks]
    clusters = [s["learner"].get("cluster") or {} for s in statuses]
    same = (len({tuple(c.get("members", ())) for c in clusters}) == 1
            and len(clusters[0].get("members", ())) == len(ranks)
            and len({s["weights_seq_no"] for s in statuses}) == 1
            and len({c["weights_digest"] for c in clusters}) == 1)
    return statuses if same else None


def test_a_job_of_two_through_lost_ranks_and_checkpoints_of_two_and_one(tmp_path):
    """One job's life, each step on the state the last left: PPO in step, rank 1 lost and
    back, rank 0's checkpoint resumed by a daemon alone, whose checkpoint starts an APPO job
    (the same job learner, V-trace in each rank's connector) that loses rank 0 and gets it
    back."""
    pool = DaemonPool(tmp_path)
    try:
        rank0, rank1 = job_of_two(tmp_path, pool)
        client = BackgroundClient(f"tcp://127.0.0.1:{rank0.port}").start()
        wait_for(lambda: rank1.status()["weights_seq_no"] >= 4, 60,  # (seq 1: the formation's
                 what="three updates of the job, clients on rank 0 only")  # publication)
        a, b = wait_for(lambda: in_step(rank0, rank1), 30, what="both ranks in step")
        for rank, status in enumerate((a, b)):
            cluster = status["learner"]["cluster"]
            assert (cluster["world_size"], cluster["rank"], cluster["members"]) == (2, rank, [0, 1])
            assert cluster["generation"] >= 1 and cluster["collective_time_s"] > 0
        assert a["learner"]["cluster"]["rows_per_rank"][1] == 0  # rank 1 contributed no rows
        assert a["learner"]["updates"] == b["learner"]["updates"] >= 3

        # rank 1 SIGKILLed: rank 0 serves on, re-forms alone within the bound, trains alone
        rank1.check_clean_exit = False
        rank1.stop(sig=signal.SIGKILL)  # the whole daemon; its roles die with it
        killed_at = time.monotonic()
        wait_for(lambda: cluster_of(rank0).get("members") == [0], 30,
                 what="rank 0 re-forming without rank 1")
        reformed_s = time.monotonic() - killed_at
        assert reformed_s < 0.5 + 5, reformed_s  # the window plus detection, on a loaded box
        seq = rank0.status()["weights_seq_no"]
        wait_for(lambda: rank0.status()["weights_seq_no"] >= seq + 2, 30, what="rank 0 training alone")
        assert client.error is None, client.error

        # it returns and rejoins with the job's weights
        rank1 = restart(pool, rank1)
        a, b = wait_for(lambda: in_step(rank0, rank1), 60,
                        what="rank 1 back in the job with the job's weights")
        assert b["learner"]["cluster"]["generation"] >= 3  # formed, without rank 1, with it
        assert b["weights_seq_no"] >= seq + 2

        # rank 0 is the job's one writer: rank 1 writes nothing on SIGUSR1 or when stopped,
        # and `rlinkd checkpoint` against it says to ask rank 0
        out = subprocess.run([sys.executable, "-m", "rlinkd.daemon.cli", "checkpoint",
                              "--state-dir", str(rank1.state_dir)], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "rank 0 writes the job's checkpoints" in out.stderr, out
        rank1.signal(signal.SIGUSR1)
        rank0.signal(signal.SIGUSR1)
        saved = wait_for(lambda: rank0.status()["last_checkpoint"] or None, 30,
                         what="rank 0's checkpoint")["weights_seq_no"]
        wait_for(lambda: '"why": "rank 0 writes the job\'s checkpoints"' in rank1.log(), 30,
                 what="rank 1 saying rank 0 writes")
        client.stop()
        assert client.error is None, client.error
        for d in (rank0, rank1):
            assert d.stop() == 0, d.log()
        assert list_checkpoints(checkpoints_dir(rank1.state_dir)) == []
        assert rank1.log().count('"event": "checkpoint_not_written"') >= 2  # SIGUSR1, shutdown

        # the job's checkpoint resumes a daemon alone ...
        alone = DaemonProcess(rank0.state_dir, [*SMALL_UPDATES])
        alone.check_clean_exit = True
        pool.started.append(alone)
        alone.start(60)
        assert alone.status()["weights_seq_no"] >= saved and '"event": "resuming"' in alone.log()
        final = alone.status()["weights_seq_no"]
        assert alone.stop() == 0  # with its final checkpoint

        # ... whose checkpoint starts a job: rank 0 resumes it, rank 1 starts fresh
        rank0, rank1 = job_of_two(tmp_path, pool, "--set", "learner.algorithm=appo",
                                  dirs=(alone.state_dir, tmp_path / "fresh"))
        a, b = wait_for(lambda: in_step(rank0, rank1), 30, what="the new job in step")
        assert a["weights_seq_no"] >= final

        # rank 0 SIGKILLed: rank 1 serves its last weights, trains nothing, writes nothing
        client = BackgroundClient(f"tcp://127.0.0.1:{rank1.port}").start()
        wait_for(lambda: rank0.status()["weights_seq_no"] >= final + 2, 60, what="the job training")
        rank0.check_clean_exit = False
        rank0.stop(sig=signal.SIGKILL)
        wait_for(lambda: cluster_of(rank1).get("members") == [], 30, what="rank 1 detached")
        held = rank1.status()["weights_seq_no"]
        steps = client.steps
        wait_for(lambda: client.steps > steps + 300, 30, what="rank 1 serving its client")
        assert rank1.status()["weights_seq_no"] == held
        assert client.error is None, client.error

        # rank 0 back, with nothing newer than its checkpoint: rank 1's newer weights win
        rank0 = restart(pool, rank0)
        a, _ = wait_for(lambda: in_step(rank0, rank1), 60, what="the job re-formed around rank 0")
        client.stop()
        assert client.error is None, client.error
        assert a["weights_seq_no"] >= held
    finally:
        pool.close()


def test_a_dqn_job_trains_in_step_with_replay_on_the_rank_that_has_clients(tmp_path):
    """DQN in a job: replay per rank, clients on rank 0 only; rank 1's empty buffer joins
    every gradient step with no rows and stalls nobody; both publish the same weights. A
    second trainable policy (PPO, without clients) joins every round without rows. Rank 1
    SIGKILLed comes back in step; the job's checkpoint resumes a daemon alone."""
    pool = DaemonPool(tmp_path)
    try:
        rank0, rank1 = job_of_two(tmp_path, pool, "--set", "learner.algorithm=dqn",
                                  "--set", "dqn.learning_starts_steps=200",
                                  "--set", "dqn.publish_interval_updates=10",
                                  "--set", "policies.red.trainable=true",
                                  "--set", "policies.red.algorithm=ppo")
        client = BackgroundClient(f"tcp://127.0.0.1:{rank0.port}").start()
        wait_for(lambda: rank1.status()["weights_seq_no"] >= 4, 60,  # (seq 1: the formation's)
                 what="three publications of the job, clients on rank 0 only")
        a, b = wait_for(lambda: in_step(rank0, rank1), 30, what="both ranks in step")
        red = [s["policies"]["red"] for s in (a, b)]
        assert red[0]["weights_seq_no"] == red[1]["weights_seq_no"]  # (no batches: as it started)
        assert red[0]["learner"]["cluster"]["weights_digest"] == red[1]["learner"]["cluster"]["weights_digest"]
        assert red[0]["learner"]["cluster"]["members"] == [0, 1]
        assert a["learner"]["algorithm"] == b["learner"]["algorithm"] == "dqn"
        assert a["learner"]["updates"] == b["learner"]["updates"] >= 30
        rows = a["learner"]["cluster"]["rows_per_rank"]
        assert rows[0] > 0 and rows[1] == 0, rows  # rank 1's buffer is empty
        assert b["learner"]["replay_steps"] == 0 and a["learner"]["replay_steps"] >= 200

        # rank 1 SIGKILLed and back: it rejoins with the job's state (rank 0's: the newer)
        rank1.check_clean_exit = False
        rank1.stop(sig=signal.SIGKILL)
        wait_for(lambda: cluster_of(rank0).get("members") == [0], 30, what="rank 0 re-forming alone")
        seq = rank0.status()["weights_seq_no"]
        wait_for(lambda: rank0.status()["weights_seq_no"] >= seq + 2, 30, what="rank 0 training alone")
        rank1 = restart(pool, rank1)
        a, b = wait_for(lambda: in_step(rank0, rank1), 60, what="rank 1 back with the job's weights")
        assert b["learner"]["updates"] == a["learner"]["updates"] and b["weights_seq_no"] >= seq + 2

        # the job's checkpoint (rank 0's) resumes a DQN daemon alone
        rank0.signal(signal.SIGUSR1)
        saved = wait_for(lambda: rank0.status()["last_checkpoint"] or None, 30,
                         what="rank 0's checkpoint")["weights_seq_no"]
        client.stop()
        assert client.error is None, client.error
        for d in (rank0, rank1):
            assert d.stop() == 0, d.log()
        alone = DaemonProcess(rank0.state_dir, ["--set", "learner.algorithm=dqn",
                                                "--set", "policies.red.trainable=true",
                                                "--set", "policies.red.algorithm=ppo"])
        alone.check_clean_exit = True
        pool.started.append(alone)
        alone.start(60)
        status = alone.status()
        assert status["weights_seq_no"] >= saved and '"event": "resuming"' in alone.log()
        assert status["learner"]["updates"] >= a["learner"]["updates"]
    finally:
        pool.close()


def test_a_sac_job_trains_in_step_with_clients_on_both_ranks_and_both_transports(tmp_path):
    """SAC in a job: a TCP client on rank 0, a shared-memory client on rank 1; every
    gradient step (critics, actor, alpha) is averaged over both ranks' rows, so both publish
    the same weights at the same weights_seq_no, and each rank's replay holds only its own
    clients' transitions."""
    pool = DaemonPool(tmp_path)
    try:
        rank0, rank1 = job_of_two(tmp_path, pool, "--set", "env.id=Pendulum-v1",
                                  "--set", "learner.algorithm=sac", "--set", "sac.hidden_sizes=[32, 32]",
                                  "--set", "sac.learning_starts_steps=200",
                                  "--set", "sac.publish_interval_updates=10")
        clients = [BackgroundClient(f"tcp://127.0.0.1:{rank0.port}", 0, "Pendulum-v1").start(),
                   BackgroundClient(f"shm:{rank1.state_dir}", 1, "Pendulum-v1").start()]
        wait_for(lambda: rank1.status()["weights_seq_no"] >= 4, 90,  # (seq 1: the formation's)
                 what="three publications of the SAC job")
        # both ranks' replays feed every step once each holds learning_starts transitions
        # (on a loaded host the TCP client may get there a few rounds after the other)
        a, b = wait_for(lambda: (st := in_step(rank0, rank1)) and min(
            st[0]["learner"]["cluster"]["rows_per_rank"]) > 0 and st, 60,
            what="both ranks in step, each with rows in the round")
        assert a["learner"]["algorithm"] == b["learner"]["algorithm"] == "sac"
        assert a["learner"]["updates"] == b["learner"]["updates"] >= 30
        assert a["learner"]["replay_steps"] >= 200 and b["learner"]["replay_steps"] >= 200
        for client in clients:
            client.stop()
            assert client.error is None, client.error
    finally:
        pool.close()


def exit_code(d: DaemonProcess, timeout_s: float = 60.0) -> int:
    code = d.proc.wait(timeout_s)
    d.check_clean_exit = False  # (checked here: 78)
    return code


def test_bad_cluster_configs_exit_78_naming_the_key(tmp_path):
    """Launched together: a rank 1 whose master is a closed loopback port (fails within its
    1 s collective timeout), and a job whose rank 1 trains different spaces than rank 0: that
    rank exits 78 naming the key, rank 0 (whose config is the job's) refuses it and runs on."""
    pool = DaemonPool(tmp_path)
    master = f"127.0.0.1:{free_port()}"
    try:
        lost = DaemonProcess(tmp_path / "lost", [
            "--set", "cluster.world_size=2", "--set", "cluster.rank=1",
            "--set", f"cluster.master=127.0.0.1:{free_port()}",  # closed: bound, then released
            "--set", "cluster.collective_timeout_s=1", "--set", "cluster.reform_window_s=0.5"])
        ranks = [DaemonProcess(tmp_path / f"rank{rank}", [
            "--set", "cluster.world_size=2", "--set", f"cluster.rank={rank}",
            "--set", f"cluster.master={master}", *FAST,
            *(("--set", "env.id=Acrobot-v1") if rank else ())]) for rank in (0, 1)]
        for d in (lost, *ranks):
            pool.started.append(d)
            d.launch()
        assert exit_code(lost) == 78, lost.log()
        assert "cluster.master = '127.0.0.1:" in lost.log() and "could not reach" in lost.log()
        assert exit_code(ranks[1]) == 78, ranks[1].log()
        assert "cluster.world_size: rank 1 and rank(s) [0] train different" in ranks[1].log()
        wait_for(lambda: '"event": "job_member_refused"' in ranks[0].log(), 30, what="rank 0's refusal")
        assert '"refused": [1]' in ranks[0].log() and ranks[0].proc.poll() is None
        wait_for(lambda: '"members": [0]' in ranks[0].log().split("job_member_refused")[-1], 30,
                 what="rank 0 forming the job again without rank 1")
        ranks[0].check_clean_exit = True  # (pool.close() stops it: exit 0)
    finally:
        pool.close()
