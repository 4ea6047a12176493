"""A daemon's learner as one rank of a job: its membership, the current torch.distributed
process group, and the collectives the learner calls (the maths is ``steps``'s).

The group is formed anew for every change of members (``membership``: generations over rank
0's TCPStore); collectives index ranks within the current group (``index``), reports use
daemon ranks. Every collective has ``cluster.collective_timeout_s`` as its timeout (gloo
honours it per operation); a member that dies makes the others' collective fail at once
(its sockets close) or at that timeout (a host gone), and the learner then re-forms.
"""
from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from rlinkd.daemon.cluster.membership import Membership
from rlinkd.daemon.cluster.steps import (pack_moments, pack_step, unpack_moments,
                                         unpack_step)
from rlinkd.daemon.config import ClusterConfig, cluster_address
from rlinkd.daemon.errors import ConfigError

POLL_S = 0.02
PLACEMENT_KEY = "placement"
"""Store key: rank 0's device kind and backend, which every rank of the job must share."""


NCCL_ERRORS_VAR = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
NCCL_ENV = {NCCL_ERRORS_VAR: "2", "TORCH_NCCL_BLOCKING_WAIT": "1"}
"""Set before an NCCL group forms, unless the environment chose: torch's default error mode
tears the process down on a timed-out collective; 2 only aborts the communicator, and a
blocking wait makes the collective's own call raise (a RuntimeError) before its result is
used: a lost member must end in a re-form, not a killed learner or a half-reduced gradient."""


def resolve_backend(backend: str, device: torch.device) -> str:
    """``auto``: nccl for a CUDA learner, gloo otherwise; an explicit choice is kept."""
    if backend != "auto":
        return backend
    return "nccl" if device.type == "cuda" else "gloo"


class Job:
    """This process's membership of the job (one per learner process). ``collective_s``
    accumulates the seconds spent inside collectives (the learner reports it per update)."""

    def __init__(self, cluster: ClusterConfig, device: torch.device, membership: Membership) -> None:
        self.cluster, self.device, self.membership = cluster, device, membership
        self.rank, self.world_size = cluster.rank, cluster.world_size
        self.backend = resolve_backend(cluster.backend, device)
        self.collective_s = 0.0
        self.generation = 0
        self.members: list[int] = []
        self.reform_wanted = False   # rank 0 sets it before a round when a rank asks to join
        self.reform_agreed = False   # set by the round's first collective, on every member
        self.leader_hparams = (0.0, 0.0)  # rank 0's (lr, ent_coef), from the same collective

    @classmethod
    def connect(cls, cluster: ClusterConfig, device: torch.device) -> Job:
        """Serve (rank 0) or reach the job's store; RuntimeError when it cannot be reached
        (or, rank 0, served) within the timeout."""
        host, port = cluster_address(cluster)
        job = cls(cluster, device, Membership(host, port, cluster.rank, cluster.world_size,
                                              cluster.collective_timeout_s))
        job.check_placement()
        return job

    @property
    def placement(self) -> str:
        """This rank's device kind and backend, e.g. ``cpu/gloo``."""
        return f"{self.device.type}/{self.backend}"

    def check_placement(self) -> None:
        """Rank 0 records its placement in the store; every other rank compares its own
        with it: ranks on different kinds of device would compute different weights from the
        same averaged gradient (and a backend mismatch would hang the group's formation), so a
        difference is a ConfigError before any group is formed."""
        store = self.membership.store
        if self.rank == 0:
            store.set(PLACEMENT_KEY, self.placement)
            return
        leader = store.get(PLACEMENT_KEY).decode()
        if leader != self.placement:
            raise ConfigError(f"learner.device / cluster.backend: rank 0 trains on {leader}, rank "
                              f"{self.rank} on {self.placement}: every rank of a job must train on "
                              "the same kind of device with the same backend (set learner.device "
                              "explicitly where `auto` chose differently)")

    def reconnect(self, timeout_s: float) -> None:
        """Reach rank 0's store again (after it was lost); RuntimeError while it is not there."""
        host, port = cluster_address(self.cluster)
        self.membership = Membership(host, port, self.rank, self.world_size, timeout_s)
        self.membership.store.set_timeout(datetime.timedelta(seconds=self.cluster.collective_timeout_s))
        self.check_placement()

    @property
    def index(self) -> int:
        """This rank's index in the current group."""
        return self.members.index(self.rank)

    # ------------------------------------------------------------ membership
    def enter(self, window_s: float, beat: Callable[[], None]) -> None:
        """Become a member of the next generation and form its process group. Rank 0 waits
        up to `window_s` for the others' wishes (the current members' and any newcomer's
        end it early); the others ask and wait for rank 0's decision (up to the collective
        timeout, asking again when left out). RuntimeError when the store is gone."""
        store = self.membership
        if self.rank == 0:
            generation = store.current() + 1
            required = sorted(set(self.members) | set(store.newcomers(generation, self.members)))
            members = store.form(generation, window_s, [r for r in required if r != 0], beat)
        else:
            generation, members = self._ask_until_member(beat)
        self._form_group(generation, members)

    def _ask_until_member(self, beat: Callable[[], None]) -> tuple[int, list[int]]:
        deadline = time.monotonic() + self.cluster.collective_timeout_s
        store = self.membership
        while time.monotonic() < deadline:
            # a beat first: after a collective failed on its timeout, a store call to a host
            # that vanished blocks up to the timeout again (two without a beat: taken for hung)
            beat()
            generation = store.current() + 1
            store.ask(generation)
            while not store.store.check([f"members/{generation}"]):
                beat()
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"rank 0 formed no generation within "
                                       f"{self.cluster.collective_timeout_s:g} s")
                time.sleep(POLL_S)
            members = store.decision(generation)
            if self.rank in members:
                return generation, members
        raise RuntimeError("not admitted to the job within the collective timeout")

    def _form_group(self, generation: int, members: list[int]) -> None:
        self.leave_group()
        self.generation, self.members = generation, members
        if self.backend == "nccl":  # a timed-out collective must raise before its result is read
            for var, value in NCCL_ENV.items():
                os.environ.setdefault(var, value)
        dist.init_process_group(self.backend, store=dist.PrefixStore(f"pg/{generation}/",
                                                                     self.membership.store),
                                rank=self.index, world_size=len(members),
                                timeout=datetime.timedelta(seconds=self.cluster.collective_timeout_s))

    def newcomers_waiting(self) -> bool:
        """Rank 0: some rank outside the group asks to join the next generation."""
        return bool(self.membership.newcomers(self.generation + 1, self.members))

    def leave_group(self) -> None:
        """Leave the current process group, if any (idempotent)."""
        if dist.is_initialized():
            dist.destroy_process_group()

    # ------------------------------------------------------------ collectives
    def _all_reduce(self, tensor: torch.Tensor) -> None:
        start = time.perf_counter()
        dist.all_reduce(tensor)
        self.collective_s += time.perf_counter() - start

    def gather(self, value: int) -> list[int]:
        """Every member's `value` (an int64), in group order (one all-reduce)."""
        vector = torch.zeros(len(self.members), dtype=torch.int64, device=self.device)
        vector[self.index] = value
        self._all_reduce(vector)
        return [int(n) for n in vector.tolist()]

    def exchange(self, mine: Sequence[float], hparams: Sequence[float] = (0.0, 0.0)
                 ) -> list[list[float]]:
        """Every member's `mine` (k numbers each), in group order, by one all-reduce
        (float64: counts stay exact below 2**53); in the same buffer whether rank 0 asks the
        group to re-form after this round, and rank 0's live `hparams` (two: lr, ent_coef),
        kept in ``leader_hparams``: a reload on rank 0 governs every rank from this round on."""
        n, k = len(self.members), len(mine)
        vector = torch.zeros(n * k + 3, dtype=torch.float64, device=self.device)
        vector[self.index * k:(self.index + 1) * k] = torch.tensor(mine, dtype=torch.float64)
        if self.rank == 0:
            vector[n * k:] = torch.tensor([float(self.reform_wanted), *hparams], dtype=torch.float64)
        self._all_reduce(vector)
        *values, reform, lr, ent_coef = vector.tolist()
        self.reform_agreed, self.leader_hparams = bool(reform), (lr, ent_coef)
        return [values[i * k:(i + 1) * k] for i in range(n)]

    def average(self, grad: torch.Tensor, stats: torch.Tensor, rows: float | torch.Tensor,
                finite: torch.Tensor) -> torch.Tensor:
        """The job's row-weighted mean gradient and diagnostics, in place, by one all-reduce;
        the step's gate (``steps.unpack_step``)."""
        buffer = pack_step(grad, stats, rows, finite)
        self._all_reduce(buffer)
        return unpack_step(buffer, grad, stats)

    def merge_moments(self, x: torch.Tensor) -> tuple[int, torch.Tensor, torch.Tensor]:
        """(N, mean, m2) of every member's observations [N_r, D] together (one all-reduce)."""
        buffer = pack_moments(x.to(self.device))
        self._all_reduce(buffer)
        return unpack_moments(buffer)

    def broadcast_(self, tensors: Sequence[torch.Tensor], source: int = 0) -> None:
        """Group member `source`'s values into ``tensors`` on every member (in place)."""
        start = time.perf_counter()
        for tensor in tensors:
            staged = tensor.to(self.device)
            dist.broadcast(staged, src=source)
            tensor.copy_(staged)
        self.collective_s += time.perf_counter() - start

    def close(self) -> None:
        """Leave the job (idempotent)."""
        self.leave_group()
