"""Who is in the job now: generations of process groups over one TCPStore served by rank 0.

torch.distributed's process group has a fixed world; a job whose ranks come and go forms a
new group for every change of its members. Rank 0's learner serves a TCPStore at
``cluster.master`` for its whole life (``wait_for_workers=False``: it never waits for a
fixed count); each group is formed on a prefix of it (``pg/<generation>/``), so the keys of
an old group never meet a new one. torch.distributed.elastic's rendezvous does the same
job for restarting whole worker groups under a launcher; here the daemons are the
long-lived processes and only the learner's group changes, so the store protocol is
kept this small:

- ``generation``: the newest generation rank 0 formed (absent before the first);
- ``want/<g>/<rank>``: rank asks to be a member of generation g;
- ``members/<g>``: rank 0's decision, comma-separated daemon ranks (rank 0 always first).

Rank 0 forms generation g from the ranks whose ``want/<g>`` arrives within a window (all
of ``world_size`` end it early); the others post their wish for ``generation + 1`` and
wait for the decision. A rank left out (it came too late) asks again for the next one.
"""
from __future__ import annotations

import datetime
import time
from collections.abc import Callable

from torch.distributed import TCPStore

GENERATION = "generation"
POLL_S = 0.02


def want_key(generation: int, rank: int) -> str:
    return f"want/{generation}/{rank}"


def members_key(generation: int) -> str:
    return f"members/{generation}"


def parse_members(text: str) -> list[int]:
    return [int(r) for r in text.split(",") if r]


class Membership:
    """This rank's handle on the job's store (rank 0 serves it, the others connect)."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, timeout_s: float) -> None:
        self.rank, self.world_size = rank, world_size
        self.store = TCPStore(host, port, None, rank == 0,
                              datetime.timedelta(seconds=timeout_s), wait_for_workers=False)

    def current(self) -> int:
        """The newest generation formed (0 before the first)."""
        return int(self.store.get(GENERATION)) if self.store.check([GENERATION]) else 0

    def form(self, generation: int, window_s: float, required: list[int],
             beat: Callable[[], None]) -> list[int]:
        """Rank 0: decide generation `generation`'s members from the wishes that arrive
        within `window_s` (early once every rank, or every rank in `required`, has asked);
        `beat()` while it waits."""
        deadline = time.monotonic() + window_s
        while True:
            beat()
            wanted = [r for r in range(1, self.world_size)
                      if self.store.check([want_key(generation, r)])]
            done = len(wanted) == self.world_size - 1 or (required and set(required) <= set(wanted))
            if done or time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
        members = [0, *wanted]
        self.store.set(members_key(generation), ",".join(map(str, members)))
        self.store.set(GENERATION, str(generation))
        return members

    def ask(self, generation: int) -> None:
        """Ask to be a member of `generation`."""
        self.store.set(want_key(generation, self.rank), "1")

    def decision(self, generation: int) -> list[int]:
        """Rank 0's members of `generation` (blocks up to the store's timeout)."""
        return parse_members(self.store.get(members_key(generation)).decode())

    def newcomers(self, generation: int, members: list[int]) -> list[int]:
        """Rank 0: ranks outside `members` asking to be in `generation`."""
        return [r for r in range(1, self.world_size)
                if r not in members and self.store.check([want_key(generation, r)])]
