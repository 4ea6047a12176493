"""Segment creation, permissions, attach checks, close with live views, sweep_stale,
sealed memfds."""

import fcntl
import os
import stat
import subprocess
import sys

import numpy as np
import pytest

from rlinkd.shm.errors import LayoutError, SegmentOwnerError
from rlinkd.shm.segment import SIZE_SEALS, Segment, segment_name, sweep_stale


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


# ---------------------------------------------------------------- sealed memfds (client rings)
def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def test_a_sealed_segment_has_no_path_and_nobody_can_change_its_size(shm_dir):
    segment = Segment.create_sealed("rlk.client-1-x", 8192)
    try:
        assert segment.path == "memfd:rlk.client-1-x" and segment.size == 8192
        assert os.listdir(shm_dir) == [] and not os.path.exists("/dev/shm/rlk.client-1-x")
        assert fcntl.fcntl(segment.fd, fcntl.F_GET_SEALS) == SIZE_SEALS
        assert SIZE_SEALS == fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
        # a second open file description (as another process of our uid could make) is bound too
        reopened = os.open(f"/proc/self/fd/{segment.fd}", os.O_RDWR)
        try:
            for fd in (segment.fd, reopened):
                for size in (0, 4096, 8193):
                    with pytest.raises(PermissionError):
                        os.ftruncate(fd, size)
                with pytest.raises(PermissionError):
                    os.posix_fallocate(fd, 8192, 4096)  # growing by allocation
                with pytest.raises(PermissionError):
                    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)  # F_SEAL_SEAL: no new seals
            os.pwrite(reopened, b"hello", 100)  # writes stay allowed: the client produces
            assert bytes(segment.buf[100:105]) == b"hello" and os.fstat(reopened).st_size == 8192
        finally:
            os.close(reopened)
    finally:
        fd = segment.fd
        segment.close()
        segment.unlink()  # nothing to remove, no error
    assert segment.fd is None and _closed(fd)


def test_from_fd_maps_the_creators_memory_and_takes_the_descriptor():
    creator = Segment.create_sealed("rlk.t", 4096)
    fd = os.dup(creator.fd)
    peer = Segment.from_fd(fd, "rlk.t")
    try:
        assert _closed(fd) and peer.path == "memfd:rlk.t" and peer.size == 4096
        held = creator.fd
        creator.close_fd()  # handed on: the creator's mapping stays
        assert creator.fd is None and _closed(held)
        peer.buf[0:3] = b"abc"
        assert bytes(creator.buf[0:3]) == b"abc"
    finally:
        peer.close()
        creator.close()


def test_from_fd_refuses_anything_whose_size_could_change(shm_dir):
    unsealed = os.memfd_create("rlk.unsealed", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(unsealed, 4096)
    with pytest.raises(LayoutError, match="seals"):
        Segment.from_fd(unsealed, "rlk.unsealed")
    assert _closed(unsealed)
    shrink_only = os.memfd_create("rlk.half", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(shrink_only, 4096)
    fcntl.fcntl(shrink_only, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
    with pytest.raises(LayoutError, match="seals"):
        Segment.from_fd(shrink_only, "rlk.half")
    Segment.create(os.path.join(shm_dir, "file"), 4096).close()  # a tmpfs file: unsealable
    with pytest.raises(LayoutError):
        Segment.from_fd(os.open(os.path.join(shm_dir, "file"), os.O_RDWR), "file")
    read_end, write_end = os.pipe()
    with pytest.raises(SegmentOwnerError, match="not a regular file"):
        Segment.from_fd(read_end, "pipe")
    assert _closed(read_end)
    os.close(write_end)
