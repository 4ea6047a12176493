"""Shared-memory segments: files in a tmpfs directory, or sealed memfds.

A ``Segment`` is a file (by default under ``/dev/shm``, but callers may pass
any directory, e.g. a systemd ``RuntimeDirectory`` on tmpfs) mapped
``MAP_SHARED`` into every process that opens it.  We do not use
``multiprocessing.shared_memory``: its resource tracker unlinks segments it
did not create and warns spuriously on Python 3.11.

A segment shared with a process we do not trust to keep its size (a
shared-memory client's ring) is a *sealed memfd* instead (``create_sealed``):
anonymous (no path anyone could open), sized once, then sealed with
``F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``.  The seals belong to the file,
not to a descriptor: every ``ftruncate`` of it, by anyone, fails with EPERM,
so no holder can make a peer's mapping fault with SIGBUS.  The creator passes
``fd`` over a Unix socket (SCM_RIGHTS); the receiver maps it with ``from_fd``,
which refuses a descriptor that lacks those seals.

Naming convention: segment file names embed the creating process id as
``<prefix>.<pid>.<anything>`` (see ``segment_name``) so that ``sweep_stale``
can remove what a crashed process left behind.

Every segment type of this package starts its header with the same four
fields, checked by ``check_magic``/``check_field`` on attach::

    offset  size  field
    0       8     magic           bytes, names the segment type (b"RLKRING1", ...)
    8       4     layout_version  u32, bumped on any incompatible layout change
    ...           capacity        type-specific unit (records, params, bytes)
    ...           writer_pid      u32, pid of the process that writes the data
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import stat

from rlinkd.shm.errors import LayoutError, SegmentOwnerError, ShmError

DEFAULT_DIRECTORY = "/dev/shm"

_CREATE_FLAGS = os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
_ATTACH_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
SIZE_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
"""Seals of every ``create_sealed`` segment: its size is fixed for good (writes stay allowed)."""
MEMFD_PATH_PREFIX = "memfd:"


def segment_name(prefix: str, role: str, pid: int | None = None) -> str:
    """File name ``<prefix>.<pid>.<role>`` understood by ``sweep_stale``."""
    if not prefix or "/" in prefix or "." in prefix or "/" in role:
        raise ValueError(f"bad segment prefix {prefix!r} or role {role!r}: no '/' anywhere, no '.' in prefix")
    return f"{prefix}.{os.getpid() if pid is None else pid}.{role}"


class Segment:
    """One mapped shared-memory file.

    Created once by the owning process (``create``), opened by peers with
    ``attach``.  ``buf`` is a writable memoryview over the whole file.  The file
    descriptor is closed right after mapping (the mapping keeps the memory),
    except for a sealed memfd made by ``create_sealed``: its creator keeps
    ``fd`` (to pass it on) until ``close_fd`` or ``close``.  The ``path`` of a memfd segment
    is ``memfd:<name>`` (a label; ``unlink`` has nothing to remove).
    """

    def __init__(self, path: str, mapping: mmap.mmap, created: bool, fd: int | None = None) -> None:
        self.path = path
        self.size = len(mapping)
        self.created = created
        self.fd = fd
        """The sealed memfd, held by its creator until ``close_fd``/``close``; None otherwise."""
        self._mapping: mmap.mmap | None = mapping
        self._buf: memoryview | None = memoryview(mapping)
        self._unlinked = path.startswith(MEMFD_PATH_PREFIX)  # a memfd has no name to unlink

    @classmethod
    def create(cls, path: str, size_bytes: int, mode: int = 0o600) -> Segment:
        """Create a new zero-filled segment of ``size_bytes`` at ``path``.

        Fails with ``FileExistsError`` if the path exists (never reuses a stale
        file), and with ``ShmError`` if tmpfs has no room (memory is reserved
        with ``posix_fallocate`` so that exhaustion shows here, not as SIGBUS
        on a later write).  On any failure the half-made file is removed.
        """
        if size_bytes <= 0:
            raise ValueError(f"segment size must be positive, got {size_bytes}")
        fd = os.open(path, _CREATE_FLAGS, mode)
        try:
            os.fchmod(fd, mode)  # umask-proof
            os.ftruncate(fd, size_bytes)
            _reserve(fd, path, size_bytes)
            mapping = mmap.mmap(fd, size_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        return cls(path, mapping, created=True)

    @classmethod
    def create_sealed(cls, name: str, size_bytes: int) -> Segment:
        """Create a zero-filled memfd of ``size_bytes`` whose size nobody can change.

        Called by the collector for each shared-memory client's ring.  Memory is
        reserved as in ``create`` (``ShmError`` when there is none); an ``OSError``
        means memfds or sealing are unavailable here (seccomp, old kernel).  The
        returned segment holds ``fd`` (close-on-exec) until ``close_fd`` or ``close``.
        """
        if size_bytes <= 0:
            raise ValueError(f"segment size must be positive, got {size_bytes}")
        path = MEMFD_PATH_PREFIX + name
        fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size_bytes)
            _reserve(fd, path, size_bytes)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SIZE_SEALS)
            mapping = mmap.mmap(fd, size_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, mapping, created=True, fd=fd)

    @classmethod
    def from_fd(cls, fd: int, name: str) -> Segment:
        """Map a sealed memfd received from its creator (SCM_RIGHTS); takes ownership of ``fd``.

        ``fd`` is closed before returning, whatever happens (the mapping keeps the memory).
        Refuses (``SegmentOwnerError``) anything but a regular file of our uid, and
        (``LayoutError``) an empty file or one without ``SIZE_SEALS`` -- a file whose size
        could change under our mapping.  ``name`` only labels errors and ``path``.
        """
        path = MEMFD_PATH_PREFIX + name
        try:
            info = os.fstat(fd)
            _check_ownership(path, info)
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            if seals & SIZE_SEALS != SIZE_SEALS:
                raise LayoutError(f"{path}: seals {seals:#x} lack {SIZE_SEALS:#x}; its size could change")
            mapping = mmap.mmap(fd, info.st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # F_GET_SEALS on something that is not a shmem file
                raise LayoutError(f"{path}: not a sealable memfd ({exc})") from exc
            raise
        finally:
            os.close(fd)
        return cls(path, mapping, created=False)

    @classmethod
    def open_checked(cls, path: str, build):
        """Attach ``path`` and return ``build(segment)`` (which checks the header); the
        mapping is closed again if ``build`` raises (e.g. ``LayoutError``)."""
        segment = cls.attach(path)
        try:
            return build(segment)
        except BaseException:
            segment.close()
            raise

    @classmethod
    def attach(cls, path: str) -> Segment:
        """Map an existing segment read-write.

        Refuses (``SegmentOwnerError``) symlinks, non-regular files and files
        owned by another uid; refuses (``LayoutError``) empty files.
        """
        try:
            fd = os.open(path, _ATTACH_FLAGS)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise SegmentOwnerError(f"{path} is a symlink; refusing to attach") from exc
            raise
        try:
            info = os.fstat(fd)
            _check_ownership(path, info)
            mapping = mmap.mmap(fd, info.st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return cls(path, mapping, created=False)

    def close_fd(self) -> None:
        """Close the memfd held since ``create_sealed`` once it has been handed on; the
        mapping stays (idempotent; nothing to do for file segments)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        """Drop this object's mapping (and its memfd, if it holds one); idempotent.

        If numpy arrays or memoryviews derived from ``buf`` are still alive the
        mapping cannot be unmapped yet (``BufferError``); we then just drop our
        references and the mapping goes away when the last view is collected.
        """
        self.close_fd()
        buf, mapping = self._buf, self._mapping
        self._buf = self._mapping = None
        if buf is not None:
            try:
                buf.release()
            except BufferError:
                pass  # views derived from buf are alive: GC unmaps later
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:
                pass  # exported views are alive: GC unmaps later

    def unlink(self) -> None:
        """Remove the file name (peers keep their mappings); idempotent."""
        if self._unlinked:
            return
        self._unlinked = True
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    @property
    def buf(self) -> memoryview:
        """Writable view over the whole file; ``ShmError`` once closed."""
        if self._buf is None:
            raise ShmError(f"segment {self.path} is closed")
        return self._buf

    @property
    def mapping(self) -> mmap.mmap:
        """The underlying mmap (for ``struct.pack_into`` fast paths)."""
        if self._mapping is None:
            raise ShmError(f"segment {self.path} is closed")
        return self._mapping

    @property
    def closed(self) -> bool:
        return self._mapping is None

    def __repr__(self) -> str:
        return f"Segment({self.path!r}, size={self.size}, closed={self.closed})"


def _reserve(fd: int, path: str, size_bytes: int) -> None:
    """Allocate tmpfs pages now so that a full tmpfs fails here, not via SIGBUS."""
    try:
        os.posix_fallocate(fd, 0, size_bytes)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.ENOMEM):
            where = path if path.startswith(MEMFD_PATH_PREFIX) else os.path.dirname(path) or "."
            raise ShmError(f"no room for {size_bytes} bytes in {where}: {exc}") from exc
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise


def _check_ownership(path: str, info: os.stat_result) -> None:
    mode = stat.S_IMODE(info.st_mode)
    if not stat.S_ISREG(info.st_mode):
        raise SegmentOwnerError(f"{path} is not a regular file (mode {info.st_mode:o})")
    if info.st_uid != os.getuid():
        raise SegmentOwnerError(
            f"{path} is owned by uid {info.st_uid} (mode {mode:04o}), not by us (uid {os.getuid()}); refusing to attach"
        )
    if info.st_size == 0:
        raise LayoutError(f"{path} is empty (mode {mode:04o}): not an rlinkd segment")


def check_magic(path: str, found: bytes, expected: bytes, kind: str) -> None:
    """Raise ``LayoutError`` unless a header's magic is ``expected``."""
    if found != expected:
        raise LayoutError(f"bad magic {found!r} in {path}: not an rlinkd {kind} (expected {expected!r})")


def check_field(path: str, field: str, found: object, expected: object) -> None:
    """Raise ``LayoutError`` naming ``field`` unless ``found == expected``."""
    if found != expected:
        raise LayoutError(f"{field} mismatch in {path}: header has {found!r}, expected {expected!r}")


def check_writer_pid(path: str, writer_pid: int) -> None:
    """A zero writer pid means the header was never completed.

    Liveness is deliberately not checked here: a checkpointer must still read
    a blob whose learner died, and readers keep the last weights across a
    learner restart.
    """
    if writer_pid <= 0:
        raise LayoutError(f"writer_pid {writer_pid} in {path}: header was never completed")


def pid_alive(pid: int) -> bool:
    """True unless ``pid`` certainly does not exist (other users' pids count as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(directory: str | os.PathLike[str], prefix: str) -> list[str]:
    """Remove ``<prefix>.<pid>.*`` files of ours whose creator pid is dead.

    Called by the daemon at start-up (and by tests).  Files of other users,
    names that do not parse and live (or reused) pids are kept.  Returns the
    removed paths.
    """
    removed = []
    for entry in os.scandir(directory):
        parts = entry.name.split(".", 2)
        if len(parts) < 3 or parts[0] != prefix or not parts[1].isdigit():
            continue
        if pid_alive(int(parts[1])):
            continue
        if entry.stat(follow_symlinks=False).st_uid != os.getuid():
            continue
        try:
            os.unlink(entry.path)
        except FileNotFoundError:
            continue  # a concurrent sweeper got it first
        removed.append(entry.path)
    return removed
