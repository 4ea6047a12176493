"""A job of two daemons on loopback (gloo): one training job, the same weights on both.

Only rank 0 has a client: rank 1, without clients, joins every update with no rows after
``cluster.peer_wait_s`` and must not stall rank 0; both ranks then publish the same
``weights_seq_no`` and the same weights (status learner.cluster.weights_digest)."""
from __future__ import annotations

import signal
import socket
import time

import pytest

from tests.conftest import DaemonPool
from tests.helpers import BackgroundClient, DaemonProcess, wait_for

pytestmark = pytest.mark.process
SMALL_UPDATES = ("--set", "sampling.train_batch_size=128", "--set", "sampling.env_steps_per_sample=128",
                 "--set", "ppo.minibatch_size=64", "--set", "ppo.num_epochs=2")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_of_two(tmp_path, pool: DaemonPool, *extra: str, dirs=None) -> list[DaemonProcess]:
    """Launch rank 0 and rank 1 at once (each one's learner waits for the other), then wait
    until both are ready (and have joined: their first publication is the job's)."""
    master = f"127.0.0.1:{free_port()}"
    ranks = []
    for rank in (0, 1):
        d = DaemonProcess(dirs[rank] if dirs else tmp_path / f"rank{rank}", [
            "--set", "cluster.world_size=2", "--set", f"cluster.rank={rank}",
            "--set", f"cluster.master={master}", "--set", "cluster.collective_timeout_s=20",
            *SMALL_UPDATES, *extra])
        d.check_clean_exit = True
        pool.started.append(d)
        ranks.append(d.launch())
    for d in ranks:
        d.wait_ready(60)
        d.remember_children()
    for d in ranks:
        wait_for(lambda d=d: cluster_of(d).get("members") == [0, 1], 60, what="the job formed")
    return ranks


def cluster_of(d: DaemonProcess) -> dict:
    return d.status()["learner"].get("cluster") or {}


@pytest.mark.parametrize("algorithm", ["ppo", "appo"])
def test_two_daemons_train_one_job_and_a_rank_without_clients_does_not_stall(tmp_path, algorithm):
    pool = DaemonPool(tmp_path)
    try:
        rank0, rank1 = job_of_two(tmp_path, pool, "--set", f"learner.algorithm={algorithm}")
        client = BackgroundClient(f"tcp://127.0.0.1:{rank0.port}").start()
        wait_for(lambda: rank1.status()["weights_seq_no"] >= 4, 60,
                 what="four updates of the job, clients on rank 0 only")
        client.stop()
        assert client.error is None, client.error

        def in_step() -> tuple[dict, dict] | None:
            a, b = rank0.status(), rank1.status()
            same = a["weights_seq_no"] == b["weights_seq_no"] and (
                a["learner"]["cluster"]["weights_digest"] == b["learner"]["cluster"]["weights_digest"])
            return same and (a, b)
        a, b = wait_for(in_step, 30, what="both ranks at the same weights_seq_no and weights")
        for rank, status in enumerate((a, b)):
            cluster = status["learner"]["cluster"]
            assert (cluster["world_size"], cluster["rank"], cluster["members"]) == (2, rank, [0, 1])
            assert cluster["generation"] >= 1 and cluster["collective_time_s"] > 0
        assert a["learner"]["cluster"]["rows_per_rank"][1] == 0  # rank 1 contributed no rows
        assert a["learner"]["updates"] == b["learner"]["updates"] >= 4
    finally:
        pool.close()


def test_a_killed_rank_is_left_out_within_the_bound_and_rejoins_with_the_jobs_weights(tmp_path):
    pool = DaemonPool(tmp_path)
    try:
        rank0, rank1 = job_of_two(tmp_path, pool, "--set", "cluster.reform_window_s=1")
        client = BackgroundClient(f"tcp://127.0.0.1:{rank0.port}").start()
        wait_for(lambda: rank1.status()["weights_seq_no"] >= 2, 60, what="the job training")
        rank1.check_clean_exit = False
        rank1.stop(sig=signal.SIGKILL)  # the whole daemon; its roles die with it
        killed_at = time.monotonic()
        wait_for(lambda: cluster_of(rank0).get("members") == [0], 30,
                 what="rank 0 re-forming without rank 1")
        reformed_s = time.monotonic() - killed_at
        seq = rank0.status()["weights_seq_no"]
        wait_for(lambda: rank0.status()["weights_seq_no"] >= seq + 2, 30, what="rank 0 training alone")
        assert client.error is None, client.error

        again = DaemonProcess(rank1.state_dir, rank1.args)
        again.check_clean_exit = True
        pool.started.append(again)
        again.launch().wait_ready(60)
        again.remember_children()

        def in_step() -> dict | None:
            a, b = cluster_of(rank0), cluster_of(again)
            return (a.get("members") == b.get("members") == [0, 1]
                    and a["weights_digest"] == b["weights_digest"]
                    and rank0.status()["weights_seq_no"] == again.status()["weights_seq_no"] and b)
        joined = wait_for(in_step, 60, what="rank 1 back in the job with the job's weights")
        client.stop()
        assert joined["generation"] >= 3  # formed, re-formed without rank 1, re-formed with it
        assert reformed_s < 1 + 10, reformed_s  # the window plus detection, on a loaded box
    finally:
        pool.close()


def test_without_rank_0_a_rank_serves_its_weights_and_rejoins_giving_the_newest(tmp_path):
    pool = DaemonPool(tmp_path)
    try:
        rank0, rank1 = job_of_two(tmp_path, pool)
        client = BackgroundClient(f"tcp://127.0.0.1:{rank1.port}").start()
        wait_for(lambda: rank0.status()["weights_seq_no"] >= 2, 60, what="the job training")
        rank0.check_clean_exit = False
        rank0.stop(sig=signal.SIGKILL)
        wait_for(lambda: cluster_of(rank1).get("members") == [], 30, what="rank 1 detached")
        held = rank1.status()["weights_seq_no"]
        steps = client.steps
        wait_for(lambda: client.steps > steps + 300, 30, what="rank 1 serving its client")
        assert rank1.status()["weights_seq_no"] == held  # serves its last weights, trains nothing
        assert client.error is None, client.error

        again = DaemonProcess(rank0.state_dir, rank0.args)  # rank 0 back, with nothing newer
        again.check_clean_exit = True
        pool.started.append(again)
        again.launch().wait_ready(60)
        again.remember_children()

        def in_step() -> dict | None:
            a, b = cluster_of(again), cluster_of(rank1)
            return (a.get("members") == b.get("members") == [0, 1]
                    and a["weights_digest"] == b["weights_digest"] and a)
        wait_for(in_step, 60, what="the job re-formed around rank 0")
        client.stop()
        assert again.status()["weights_seq_no"] >= held  # rank 1's newer weights won
    finally:
        pool.close()


def exit_code(d: DaemonProcess, timeout_s: float = 60.0) -> int:
    code = d.proc.wait(timeout_s)
    d.check_clean_exit = False  # (checked here: 78)
    return code


def test_an_unreachable_master_is_a_config_error_naming_it(tmp_path):
    pool = DaemonPool(tmp_path)
    try:
        d = DaemonProcess(tmp_path / "rank1", [
            "--set", "cluster.world_size=2", "--set", "cluster.rank=1",
            "--set", f"cluster.master=127.0.0.1:{free_port()}", "--set", "cluster.collective_timeout_s=1"])
        pool.started.append(d)
        assert exit_code(d.launch()) == 78, d.log()
        assert "cluster.master = '127.0.0.1:" in d.log() and "could not reach" in d.log()
    finally:
        pool.close()


def test_ranks_training_different_spaces_both_exit_78(tmp_path):
    pool = DaemonPool(tmp_path)
    master = f"127.0.0.1:{free_port()}"
    try:
        ranks = [DaemonProcess(tmp_path / f"rank{rank}", [
            "--set", "cluster.world_size=2", "--set", f"cluster.rank={rank}",
            "--set", f"cluster.master={master}", "--set", "cluster.collective_timeout_s=20",
            *(("--set", "env.id=Acrobot-v1") if rank else ())]) for rank in (0, 1)]
        for d in ranks:
            pool.started.append(d)
            d.launch()
        for rank, d in enumerate(ranks):
            assert exit_code(d) == 78, d.log()
            assert f"cluster.world_size: rank {rank} and rank(s) [{1 - rank}] train different" in d.log()
    finally:
        pool.close()


def test_a_jobs_checkpoint_resumes_a_daemon_alone_and_a_daemons_starts_a_job(tmp_path):
    pool = DaemonPool(tmp_path)
    try:
        rank0, rank1 = job_of_two(tmp_path, pool)
        client = BackgroundClient(f"tcp://127.0.0.1:{rank0.port}").start()
        wait_for(lambda: rank1.status()["weights_seq_no"] >= 2, 60, what="the job training")
        rank1.signal(signal.SIGUSR1)  # any rank's checkpoint holds the job's learner state
        saved = wait_for(lambda: rank1.status()["last_checkpoint"] or None, 30,
                         what="rank 1's checkpoint")["weights_seq_no"]
        client.stop()
        for d in (rank0, rank1):
            assert d.stop() == 0, d.log()

        alone = DaemonProcess(rank1.state_dir, [*SMALL_UPDATES])  # the job's, as a daemon alone
        alone.check_clean_exit = True
        pool.started.append(alone)
        alone.start(60)
        assert alone.status()["weights_seq_no"] >= saved and '"event": "resuming"' in alone.log()
        final = alone.status()["weights_seq_no"]
        assert alone.stop() == 0  # with its final checkpoint

        # the daemon alone's checkpoint starts a job: rank 0 resumes it, rank 1 starts fresh
        rank0, rank1 = job_of_two(tmp_path, pool, dirs=(rank1.state_dir, tmp_path / "fresh"))
        statuses = [d.status() for d in (rank0, rank1)]
        assert statuses[0]["weights_seq_no"] == statuses[1]["weights_seq_no"] >= final
        digests = {s["learner"]["cluster"]["weights_digest"] for s in statuses}
        assert len(digests) == 1, digests
    finally:
        pool.close()
