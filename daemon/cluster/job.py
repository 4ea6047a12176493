"""A daemon's learner as one rank of a job: the torch.distributed process group and the
collectives the learner calls (the maths is ``steps``'s).

Rendezvous: ``init_process_group`` with ``tcp://<cluster.master>``; rank 0 serves the
TCPStore there, the other ranks connect to it until ``cluster.collective_timeout_s``.
Every collective has that timeout too (gloo honours it per operation). After joining, rank
0's training state is broadcast (``broadcast_``): a rank that joins takes the job's weights.
"""
from __future__ import annotations

import datetime
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from rlinkd.daemon.cluster.steps import (pack_moments, pack_step, unpack_moments,
                                         unpack_step)
from rlinkd.daemon.config import ClusterConfig, cluster_address


def resolve_backend(backend: str, device: torch.device) -> str:
    """``auto``: nccl for a CUDA learner, gloo otherwise; an explicit choice is kept."""
    if backend != "auto":
        return backend
    return "nccl" if device.type == "cuda" else "gloo"


class Job:
    """This process's membership of the job (one per learner process). ``collective_s``
    accumulates the seconds spent inside collectives (the learner reports it per update)."""

    def __init__(self, rank: int, world_size: int, device: torch.device) -> None:
        self.rank, self.world_size, self.device = rank, world_size, device
        self.collective_s = 0.0
        self.generation = 1  # bumped each time the group is formed anew

    @classmethod
    def join(cls, cluster: ClusterConfig, device: torch.device) -> Job:
        """Form (rank 0) or join the job's process group; RuntimeError (or a DistError, its
        subclass) when the rendezvous does not complete within the timeout."""
        host, port = cluster_address(cluster)
        dist.init_process_group(resolve_backend(cluster.backend, device),
                                init_method=f"tcp://{host}:{port}", rank=cluster.rank,
                                world_size=cluster.world_size,
                                timeout=datetime.timedelta(seconds=cluster.collective_timeout_s))
        return cls(cluster.rank, cluster.world_size, device)

    def _all_reduce(self, tensor: torch.Tensor) -> None:
        start = time.perf_counter()
        dist.all_reduce(tensor)
        self.collective_s += time.perf_counter() - start

    def rows_per_rank(self, rows: int) -> list[int]:
        """Every rank's row count for the coming update (one all-reduce)."""
        return self.gather(rows)

    def gather(self, value: int) -> list[int]:
        """Every rank's `value` (an int64), in rank order (one all-reduce)."""
        vector = torch.zeros(self.world_size, dtype=torch.int64, device=self.device)
        vector[self.rank] = value
        self._all_reduce(vector)
        return [int(n) for n in vector.tolist()]

    def average(self, grad: torch.Tensor, stats: torch.Tensor, rows: float,
                finite: torch.Tensor) -> torch.Tensor:
        """The job's row-weighted mean gradient and diagnostics, in place, by one all-reduce;
        the step's gate (``steps.unpack_step``)."""
        buffer = pack_step(grad, stats, rows, finite)
        self._all_reduce(buffer)
        return unpack_step(buffer, grad, stats)

    def merge_moments(self, x: torch.Tensor) -> tuple[int, torch.Tensor, torch.Tensor]:
        """(N, mean, m2) of every rank's observations [N_r, D] together (one all-reduce)."""
        buffer = pack_moments(x.to(self.device))
        self._all_reduce(buffer)
        return unpack_moments(buffer)

    def broadcast_(self, tensors: Sequence[torch.Tensor], source: int = 0) -> None:
        """Rank `source`'s values into ``tensors`` on every rank (in place, in order)."""
        start = time.perf_counter()
        for tensor in tensors:
            staged = tensor.to(self.device)
            dist.broadcast(staged, src=source)
            tensor.copy_(staged)
        self.collective_s += time.perf_counter() - start

    def close(self) -> None:
        """Leave the job (idempotent)."""
        if dist.is_initialized():
            dist.destroy_process_group()
