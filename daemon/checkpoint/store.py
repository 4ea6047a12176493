"""Checkpoints on disk: atomic directories with a manifest written last.

Layout under ``<state_dir>/checkpoints/``::

    ckpt-000042/            one directory per checkpoint, index strictly increasing
        learner.pt          torch.save of plain tensors/containers (weights_only loadable)
        policy.onnx         the current policy, for deployment without rlinkd (absent when the
                            weights board had moved on before the checkpointer read it)
        policy.json         spaces and PolicySpec of that policy (daemon.export.policy_description)
        policies/<name>/    every policy other than `default`: its learner.pt, policy.onnx,
                            policy.json (the files above are the default policy's)
        config.toml         the effective config
        manifest.json       written last: format, versions, config hash, counters,
                            weights_seq_no, sha256 + size of every other file
    .staging-*/             a checkpoint being written (removed at start if left over)
    previous-<UTC time>/    the checkpoints of an older run, set aside by ``serve --fresh``
                            (kept, never resumed, pruned or exported from)

Writing: files go into a staging directory on the same filesystem, each fsynced,
then the manifest (fsynced), the staging directory fsynced, renamed into place, and
the parent fsynced. A crash at any moment leaves either no new checkpoint or a
complete one. Loading verifies every sha256 and falls back to older checkpoints.
Nothing here unpickles: the learner reads ``learner.pt`` with weights_only=True.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from rlinkd.client_lib.protocol.agents import DEFAULT_POLICY
from rlinkd.daemon.errors import CheckpointError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
NAME_RE = re.compile(r"^ckpt-(\d{6,})$")


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    index: int
    manifest: dict

    @property
    def weights_seq_no(self) -> int:
        return int(self.manifest.get("weights_seq_no", -1))

    @property
    def counters(self) -> dict:
        return dict(self.manifest.get("counters", {}))


def checkpoints_dir(state_dir: str | os.PathLike) -> Path:
    return Path(state_dir) / "checkpoints"


def fsync_path(path: Path) -> None:
    """fsync a file or directory by path (a directory: so a rename in it is durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes, mode: int = 0o600, exclusive: bool = False) -> None:
    """Write ``data`` to ``path`` and fsync it (the caller renames it into place and fsyncs
    the directory). ``exclusive``: fail if ``path`` exists. Checkpoint files are 0600:
    config.toml holds server.token; the weights are nobody else's business either."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(path, flags, mode)
    with open(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _index_of(path: Path) -> int | None:
    match = NAME_RE.match(path.name)
    return int(match.group(1)) if match else None


def _indexed_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(index, directory) of every checkpoint, newest (highest index) first."""
    if not root.is_dir():
        return []
    found = [(i, p) for p in root.iterdir() if (i := _index_of(p)) is not None and p.is_dir()]
    return sorted(found, reverse=True)


def list_checkpoints(root: Path) -> list[Path]:
    """Checkpoint directories, newest (highest index) first."""
    return [p for _, p in _indexed_checkpoints(root)]


def write_checkpoint(root: Path, files: dict[str, bytes], meta: dict) -> Checkpoint:
    """Write ``files`` + a manifest atomically as the next ``ckpt-NNNNNN``; returns it."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    existing = _indexed_checkpoints(root)
    index = existing[0][0] + 1 if existing else 1
    staging = root / f".staging-{index:06d}-{secrets.token_hex(4)}"
    staging.mkdir(mode=0o700)
    try:
        digests = {}
        for name, data in files.items():
            _check_name(staging, name)
            (staging / name).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_durably(staging / name, data)
            digests[name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        manifest = dict(meta, format_version=FORMAT_VERSION, index=index, files=digests,
                        created_at=time.time())
        write_durably(staging / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
        for sub in sorted({(staging / n).parent for n in files} - {staging}, reverse=True):
            fsync_path(sub)
        fsync_path(staging)
        final = root / f"ckpt-{index:06d}"
        os.rename(staging, final)
        fsync_path(root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Checkpoint(final, index, manifest)


def verify(path: Path) -> Checkpoint:
    """Check the manifest and every file's size and sha256; CheckpointError if anything is off."""
    ckpt = read_manifest(path)
    for name, info in ckpt.manifest.get("files", {}).items():
        _verified_bytes(path, name, info)
    return ckpt


def read_manifest(path: Path) -> Checkpoint:
    """The checkpoint with its manifest checked (format, file entries, names) but no file
    read: for a reader that then takes single files with ``read_checkpoint_file`` (each
    checked on its own) rather than hashing every file, a large replay.bin included, again."""
    index = _index_of(path)
    try:
        manifest = json.loads((path / MANIFEST).read_bytes())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: unknown checkpoint format")
    files = manifest.get("files", {})
    if not isinstance(files, dict) or not all(isinstance(i, dict) for i in files.values()):
        raise CheckpointError(f"{path}: malformed manifest (files)")
    for name in files:
        _check_name(path, name)
    return Checkpoint(path, index or 0, manifest)


def policy_file(policy: str, name: str) -> str:
    """Where a policy's file lives in a checkpoint: the default policy's at the top level
    (as before there were several policies), any other's under ``policies/<name>/``."""
    return name if policy == DEFAULT_POLICY else f"policies/{policy}/{name}"


def _check_name(path: Path, name: object) -> None:
    """A manifest file name: a relative path of plain components (no '', '.', '..')."""
    if not isinstance(name, str) or any(c in ("", ".", "..") for c in name.split("/")):
        raise CheckpointError(f"{path}: manifest names a file outside the checkpoint")


def _verified_bytes(path: Path, name: str, info: dict) -> bytes:
    """One file's bytes, checked against its manifest entry (size and sha256)."""
    try:
        data = (path / name).read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{path}: missing {name} ({exc.strerror})") from None
    if len(data) != info.get("bytes") or hashlib.sha256(data).hexdigest() != info.get("sha256"):
        raise CheckpointError(f"{path}: {name} does not match its manifest (corrupt)")
    return data


def latest_valid(root: Path, warn=None) -> Checkpoint | None:
    """The newest checkpoint that verifies; corrupt/partial ones are reported and skipped."""
    for path in list_checkpoints(root):
        try:
            return verify(path)
        except CheckpointError as exc:
            if warn:
                warn(str(exc))
    return None


def read_checkpoint_file(path: str | os.PathLike, name: str) -> bytes:
    """One file of a checkpoint, verified against the manifest (the bytes returned are the
    bytes checked, not a second read)."""
    files = read_manifest(Path(path)).manifest.get("files", {})
    if name not in files:
        raise CheckpointError(f"{path}: has no {name}")
    return _verified_bytes(Path(path), name, files[name])


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints; returns the removed paths."""
    removed = []
    for path in list_checkpoints(root)[keep:]:
        trash = root / f".trash-{path.name}-{secrets.token_hex(4)}"
        os.rename(path, trash)  # a half-deleted directory must never look like a checkpoint
        shutil.rmtree(trash, ignore_errors=True)
        removed.append(path)
    return removed


def remove_staging(root: Path) -> list[Path]:
    """Remove leftover staging directories of checkpoints that never completed."""
    if not root.is_dir():
        return []
    leftovers = [p for p in root.iterdir() if p.name.startswith((".staging-", ".trash-"))]
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True)
    return leftovers


def set_aside(root: Path, now_s: float | None = None) -> Path | None:
    """Move every checkpoint under ``root`` into ``root/previous-<UTC time>/`` (what
    ``serve --fresh`` does, so that a later plain start cannot resume an older run); the
    folder moved into, or None when there was nothing to move."""
    found = list_checkpoints(root)
    if not found:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now_s is None else now_s))
    aside, n = root / f"previous-{stamp}", 1
    while aside.exists():
        n += 1
        aside = root / f"previous-{stamp}-{n}"
    aside.mkdir(mode=0o700)
    for path in found:
        os.rename(path, aside / path.name)
    fsync_path(aside)
    fsync_path(root)
    return aside
