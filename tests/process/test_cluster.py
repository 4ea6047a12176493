"""A job of two daemons on loopback (gloo): one training job, the same weights on both.

Only rank 0 has a client: rank 1, without clients, joins every update with no rows after
``cluster.peer_wait_s`` and must not stall rank 0; both ranks then publish the same
``weights_seq_no`` and the same weights (status learner.cluster.weights_digest)."""
from __future__ import annotations

import socket

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


def job_of_two(tmp_path, pool: DaemonPool, *extra: str) -> list[DaemonProcess]:
    """Launch rank 0 and rank 1 at once (each one's learner waits for the other), then wait
    until both are ready."""
    master = f"127.0.0.1:{free_port()}"
    ranks = []
    for rank in (0, 1):
        d = DaemonProcess(tmp_path / f"rank{rank}", [
            "--set", "cluster.world_size=2", "--set", f"cluster.rank={rank}",
            "--set", f"cluster.master={master}", "--set", "cluster.collective_timeout_s=20",
            *SMALL_UPDATES, *extra])
        d.check_clean_exit = True
        pool.started.append(d)
        ranks.append(d.launch())
    for d in ranks:
        d.wait_ready(60)
        d.remember_children()
    return ranks


def cluster_of(d: DaemonProcess) -> dict:
    return d.status()["learner"].get("cluster") or {}


def test_two_daemons_train_one_job_and_a_rank_without_clients_does_not_stall(tmp_path):
    pool = DaemonPool(tmp_path)
    try:
        rank0, rank1 = job_of_two(tmp_path, pool)
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
