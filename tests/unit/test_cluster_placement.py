"""Every rank of a job trains on rank 0's kind of device with rank 0's backend: a rank whose
placement differs stops with a ConfigError before any process group is formed."""
from __future__ import annotations

import pytest
import torch

from rlinkd.daemon.cluster.job import Job
from rlinkd.daemon.config import ClusterConfig
from rlinkd.daemon.errors import ConfigError
from tests.helpers import free_port


def cluster(rank: int, port: int, backend: str = "auto") -> ClusterConfig:
    return ClusterConfig(world_size=2, rank=rank, master=f"127.0.0.1:{port}", backend=backend,
                         collective_timeout_s=5.0)


def test_a_rank_on_rank_0s_placement_joins_and_another_is_refused_naming_the_keys():
    port = free_port()
    leader = Job.connect(cluster(0, port), torch.device("cpu"))
    same = Job.connect(cluster(1, port), torch.device("cpu"))
    try:
        assert leader.placement == same.placement == "cpu/gloo"
        with pytest.raises(ConfigError, match=r"learner.device / cluster.backend: rank 0 trains on "
                                              r"cpu/gloo, rank 1 on cpu/nccl"):
            Job.connect(cluster(1, port, backend="nccl"), torch.device("cpu"))
        same.reconnect(timeout_s=5.0)  # a rank that reaches rank 0 again checks once more:
        same.backend = "nccl"          # as if it had come back on another backend
        with pytest.raises(ConfigError, match=r"rank 0 trains on cpu/gloo, rank 1 on cpu/nccl"):
            same.reconnect(timeout_s=5.0)
    finally:
        same.close()
        leader.close()
