"""``serve --fresh`` starts a run a later plain start cannot confuse with an older one: a
fresh run SIGKILLed before its first checkpoint, then started without ``--fresh``, does not
resume the older run's checkpoint (it was set aside into ``checkpoints/previous-*/``)."""
from __future__ import annotations

import signal

import pytest

from rlinkd.daemon.checkpoint import store

pytestmark = [pytest.mark.process]


def restart(d, *args: str) -> None:
    d.args = [a for a in d.args if a != "--fresh"] + list(args)
    d.proc = None
    d.start()


def test_a_killed_fresh_run_is_not_resumed_from_the_older_runs_checkpoint(daemon_factory):
    d = daemon_factory(name="s")
    root = store.checkpoints_dir(d.state_dir)
    assert d.stop() == 0  # (the final checkpoint of the older run)
    older = store.list_checkpoints(root)
    assert older, "the older run wrote no checkpoint"
    restart(d, "--fresh")
    assert d.status()["last_checkpoint"] == {}
    d.signal(signal.SIGKILL)  # before the fresh run's first checkpoint
    d.proc.wait(30)
    assert store.list_checkpoints(root) == []
    restart(d)
    assert d.status()["last_checkpoint"] == {}, "the plain start resumed the older run"
    kept = [p for p in root.iterdir() if p.name.startswith("previous-")]
    assert [sorted(q.name for q in p.iterdir()) for p in kept] == [sorted(p.name for p in older)]
