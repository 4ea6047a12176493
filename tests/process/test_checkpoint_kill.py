"""SIGKILL of the whole daemon at random moments during checkpoint writes, 8 times:
the newest checkpoint on disk always verifies and the daemon always resumes from it."""
from __future__ import annotations

import os
import random
import signal
import time

import pytest

from rlinkd.daemon.checkpoint import store
from tests.helpers import wait_for

pytestmark = [pytest.mark.process, pytest.mark.slow]

KILLS = 8  # (half aimed at a write; each kill is a daemon start, ~5 s of the CI budget)
NET = ("--set", "ppo.hidden_sizes=[1024, 1024]")  # ~25 MB per checkpoint: a write lasts long enough to be hit


def staging_seen(root) -> bool:
    return root.exists() and any(p.name.startswith(".staging-") for p in root.iterdir())


def kill_moment(d, root, rng: random.Random, aim_at_write: bool) -> None:
    """Even iterations: SIGKILL the instant a staging directory appears (+0-1 ms); odd
    ones: at a random moment after a burst of SIGUSR1s."""
    for _ in range(3):
        d.signal(signal.SIGUSR1)
        if aim_at_write:
            deadline = time.monotonic() + 5.0
            while not staging_seen(root) and time.monotonic() < deadline:
                time.sleep(0.0005)
            time.sleep(rng.uniform(0.0, 0.001))
            return
        time.sleep(rng.uniform(0.0, 0.1))
    time.sleep(rng.uniform(0.0, 0.3))


def first_checkpoint(d, root) -> None:
    """One complete checkpoint before the kills begin, so that every restart has one to
    resume from (on a loaded host the learner of this big net boots slowly: a SIGUSR1 that
    comes before it can write is not a checkpoint, and a CI run once killed every write)."""
    asked = [0.0]

    def written():
        if time.monotonic() - asked[0] > 2.0:
            d.signal(signal.SIGUSR1)
            asked[0] = time.monotonic()
        return store.list_checkpoints(root)
    wait_for(written, 120, what="a first complete checkpoint")


def test_sigkill_during_checkpoint_writes_never_corrupts(daemon_factory):
    rng = random.Random(1234)
    d = daemon_factory(*NET, name="s")
    killed_pids, mid_write, resumed = [], 0, 0
    first_checkpoint(d, store.checkpoints_dir(d.state_dir))
    for i in range(KILLS):
        root = store.checkpoints_dir(d.state_dir)
        if i:
            d.proc = None
            d.start()
            resumed += d.status()["last_checkpoint"] != {}
        kill_moment(d, root, rng, aim_at_write=i % 2 == 0)
        killed_pids.append(d.pid)
        d.signal(signal.SIGKILL)
        d.proc.wait(30)
        mid_write += staging_seen(root)
        for path in store.list_checkpoints(root):  # every visible checkpoint is complete
            store.verify(path)
    d.proc = None
    d.start()  # a clean start sweeps the killed daemons' segments and staging directories
    status = d.status()
    assert status["last_checkpoint"], "nothing was ever checkpointed"
    assert resumed == KILLS - 1  # (every restart resumed from the newest complete checkpoint)
    print(f"{mid_write} of {KILLS} kills landed during a checkpoint write")
    assert mid_write >= KILLS // 4, f"only {mid_write} kills landed during a checkpoint write"
    assert not any(p.name.startswith(".staging-") for p in store.checkpoints_dir(d.state_dir).iterdir())
    leftovers = [n for n in os.listdir("/dev/shm") if any(n.startswith(f"rlinkd.{p}.") for p in killed_pids)]
    assert leftovers == []
    wait_for(lambda: d.status()["children"]["learner"]["alive"], 30, what="learner")
