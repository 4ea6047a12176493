"""Segment creation, permissions, attach checks, close with live views, sweep_stale."""

import os
import stat
import subprocess
import sys

import numpy as np
import pytest

from rlinkd.shm.errors import LayoutError, SegmentOwnerError
from rlinkd.shm.segment import Segment, segment_name, sweep_stale


@pytest.fixture
def permissive_umask():
    old = os.umask(0)
    yield
    os.umask(old)


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_create_is_0600_whatever_the_umask(shm_dir, permissive_umask):
    segment = Segment.create(os.path.join(shm_dir, "a"), 4096)
    assert _mode(segment.path) == 0o600
    os.umask(0o077)
    wider = Segment.create(os.path.join(shm_dir, "b"), 4096, mode=0o640)
    assert _mode(wider.path) == 0o640  # fchmod beats the umask in both directions
    segment.close()
    wider.close()


def test_create_refuses_an_existing_path(shm_dir):
    path = os.path.join(shm_dir, "x")
    Segment.create(path, 64).close()
    with pytest.raises(FileExistsError):
        Segment.create(path, 64)


def test_attach_sees_the_creators_bytes(shm_dir):
    creator = Segment.create(os.path.join(shm_dir, "s"), 8192)
    creator.buf[100:105] = b"hello"
    peer = Segment.attach(creator.path)
    assert peer.size == 8192 and bytes(peer.buf[100:105]) == b"hello"
    peer.buf[0] = 7
    assert creator.buf[0] == 7
    peer.close()
    creator.close()


def test_attach_refuses_symlinks_empty_files_and_foreign_owners(shm_dir, monkeypatch):
    target = Segment.create(os.path.join(shm_dir, "t"), 64)
    link = os.path.join(shm_dir, "link")
    os.symlink(target.path, link)
    with pytest.raises(SegmentOwnerError, match="symlink"):
        Segment.attach(link)
    empty = os.path.join(shm_dir, "empty")
    open(empty, "wb").close()
    with pytest.raises(LayoutError, match="is empty"):
        Segment.attach(empty)
    owner = os.stat(target.path).st_uid
    monkeypatch.setattr(os, "getuid", lambda: owner + 1)  # we are someone else now
    with pytest.raises(SegmentOwnerError, match=rf"owned by uid {owner} \(mode 0600\)"):
        Segment.attach(target.path)
    monkeypatch.undo()
    target.close()


def test_close_is_safe_and_idempotent_with_live_numpy_views(shm_dir):
    segment = Segment.create(os.path.join(shm_dir, "v"), 4096)
    view = np.frombuffer(segment.buf, np.uint32, 16)
    view[:] = 9
    segment.close()
    segment.close()
    assert segment.closed
    assert view.sum() == 9 * 16  # the mapping outlives close() while a view holds it
    segment.unlink()
    segment.unlink()
    assert not os.path.exists(segment.path)


def _dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_sweep_stale_removes_dead_pids_only(shm_dir):
    dead = _dead_pid()
    stale = Segment.create(os.path.join(shm_dir, segment_name("rlk", "ring0", pid=dead)), 64)
    alive = Segment.create(os.path.join(shm_dir, segment_name("rlk", "ring0")), 64)
    other_prefix = Segment.create(os.path.join(shm_dir, f"other.{dead}.ring0"), 64)
    unparsable = Segment.create(os.path.join(shm_dir, "rlk.notapid.x"), 64)
    removed = sweep_stale(shm_dir, "rlk")
    assert removed == [stale.path]
    assert sorted(os.listdir(shm_dir)) == sorted(
        os.path.basename(s.path) for s in (alive, other_prefix, unparsable))
    for segment in (stale, alive, other_prefix, unparsable):
        segment.close()


def test_segment_name_embeds_our_pid_and_rejects_separators():
    assert segment_name("rlk", "board") == f"rlk.{os.getpid()}.board"
    with pytest.raises(ValueError):
        segment_name("r.lk", "board")
    with pytest.raises(ValueError):
        segment_name("rlk", "a/b")
