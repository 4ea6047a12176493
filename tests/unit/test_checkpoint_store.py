"""daemon.checkpoint.store: atomic write, verify, fallback, staging cleanup, prune (tmp_path)."""
from __future__ import annotations

import hashlib
import json
import os

import pytest

from rlinkd.daemon.checkpoint import store
from rlinkd.daemon.errors import CheckpointError

FILES = {"learner.pt": b"\x80weights" * 100, "policy.onnx": b"onnx-bytes", "config.toml": b"[ppo]\n"}


def write(root, n: int = 1, **meta):
    out = []
    for i in range(n):
        files = {k: v + str(i).encode() for k, v in FILES.items()}
        out.append(store.write_checkpoint(root, files, dict({"weights_seq_no": 10 + i}, **meta)))
    return out


def names(root) -> list[str]:
    return sorted(p.name for p in root.iterdir())


# ---------------------------------------------------------------- write / verify
def test_write_checkpoint_layout_and_manifest(tmp_path):
    root = tmp_path / "checkpoints"
    ckpt = store.write_checkpoint(root, FILES, {"weights_seq_no": 42, "counters": {"env_steps": 7}})
    assert ckpt.path == root / "ckpt-000001" and ckpt.index == 1
    assert names(root) == ["ckpt-000001"]                      # no staging left behind
    assert sorted(p.name for p in ckpt.path.iterdir()) == sorted([*FILES, "manifest.json"])
    manifest = json.loads((ckpt.path / "manifest.json").read_text())
    assert manifest == ckpt.manifest
    assert manifest["format_version"] == store.FORMAT_VERSION and manifest["index"] == 1
    for name, data in FILES.items():
        assert (ckpt.path / name).read_bytes() == data
        assert manifest["files"][name] == {"sha256": hashlib.sha256(data).hexdigest(),
                                           "bytes": len(data)}
    assert ckpt.weights_seq_no == 42 and ckpt.counters == {"env_steps": 7}
    verified = store.verify(ckpt.path)
    assert verified.index == 1 and verified.manifest == manifest


def test_indices_increase(tmp_path):
    ckpts = write(tmp_path, 3)
    assert [c.index for c in ckpts] == [1, 2, 3]
    assert [p.name for p in store.list_checkpoints(tmp_path)] == [
        "ckpt-000003", "ckpt-000002", "ckpt-000001"]


def test_list_ignores_other_entries(tmp_path):
    write(tmp_path, 1)
    (tmp_path / "ckpt-12").mkdir()               # too few digits
    (tmp_path / "ckpt-000009").write_text("x")   # a file, not a directory
    (tmp_path / ".staging-000005-abcd").mkdir()
    (tmp_path / "notes").mkdir()
    assert [p.name for p in store.list_checkpoints(tmp_path)] == ["ckpt-000001"]
    assert store.list_checkpoints(tmp_path / "missing") == []


def test_checkpoint_defaults_without_meta(tmp_path):
    ckpt = store.write_checkpoint(tmp_path, {"a": b"1"}, {})
    assert ckpt.weights_seq_no == -1 and ckpt.counters == {}


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "manifest_garbage",
                                    "manifest_missing", "wrong_format", "files_not_a_table",
                                    "entry_not_a_table", "manifest_not_object"])
def test_verify_detects_damage(tmp_path, damage):
    (ckpt,) = write(tmp_path, 1)
    pt, manifest = ckpt.path / "learner.pt", ckpt.path / "manifest.json"
    m = json.loads(manifest.read_text())
    if damage == "flip":
        data = bytearray(pt.read_bytes())
        data[5] ^= 0xFF
        pt.write_bytes(bytes(data))
    elif damage == "truncate":
        pt.write_bytes(pt.read_bytes()[:-1])
    elif damage == "delete":
        pt.unlink()
    elif damage == "manifest_garbage":
        manifest.write_bytes(b"{\xff not json")
    elif damage == "manifest_missing":
        manifest.unlink()
    elif damage == "wrong_format":
        manifest.write_text(json.dumps(dict(m, format_version=99)))
    elif damage == "files_not_a_table":
        manifest.write_text(json.dumps(dict(m, files=["learner.pt"])))
    elif damage == "entry_not_a_table":
        manifest.write_text(json.dumps(dict(m, files={"learner.pt": "abc"})))
    else:
        manifest.write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="ckpt-000001"):
        store.verify(ckpt.path)


# ---------------------------------------------------------------- latest_valid
def test_latest_valid_is_the_newest(tmp_path):
    ckpts = write(tmp_path, 3)
    warnings = []
    latest = store.latest_valid(tmp_path, warn=warnings.append)
    assert latest.path == ckpts[-1].path and latest.weights_seq_no == 12 and warnings == []


def test_corrupt_newest_falls_back_to_previous_with_a_warning(tmp_path):
    ckpts = write(tmp_path, 3)
    (ckpts[2].path / "policy.onnx").write_bytes(b"tampered")
    (ckpts[1].path / "manifest.json").unlink()              # the one before is partial
    warnings = []
    latest = store.latest_valid(tmp_path, warn=warnings.append)
    assert latest.path == ckpts[0].path and latest.index == 1
    assert len(warnings) == 2
    assert "ckpt-000003" in warnings[0] and "policy.onnx" in warnings[0]
    assert "ckpt-000002" in warnings[1] and "manifest" in warnings[1]
    assert store.latest_valid(tmp_path) == latest           # warn is optional


def test_latest_valid_none(tmp_path):
    assert store.latest_valid(tmp_path / "nothing") is None
    (ckpt,) = write(tmp_path, 1)
    (ckpt.path / "config.toml").unlink()
    warnings = []
    assert store.latest_valid(tmp_path, warn=warnings.append) is None and len(warnings) == 1


def test_new_checkpoint_after_a_corrupt_one_gets_the_next_index(tmp_path):
    ckpts = write(tmp_path, 2)
    (ckpts[1].path / "learner.pt").write_bytes(b"")
    (new,) = write(tmp_path, 1)
    assert new.index == 3 and store.latest_valid(tmp_path).path == new.path


# ---------------------------------------------------------------- staging
def test_failed_write_removes_its_staging_dir(tmp_path, monkeypatch):
    write(tmp_path, 1)
    calls = []
    real = store.write_durably

    def failing(path, data):
        calls.append(path.name)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real(path, data)

    monkeypatch.setattr(store, "write_durably", failing)
    with pytest.raises(OSError, match="No space left"):
        store.write_checkpoint(tmp_path, FILES, {})
    assert names(tmp_path) == ["ckpt-000001"]
    assert store.latest_valid(tmp_path).index == 1


def test_failed_rename_removes_staging(tmp_path, monkeypatch):
    def no_rename(src, dst):
        raise OSError(5, "I/O error")

    monkeypatch.setattr(store.os, "rename", no_rename)
    with pytest.raises(OSError):
        store.write_checkpoint(tmp_path, FILES, {})
    assert names(tmp_path) == []


def test_leftover_staging_and_trash_dirs_are_removed(tmp_path):
    write(tmp_path, 1)
    leftover = tmp_path / ".staging-000002-deadbeef"
    leftover.mkdir()
    (leftover / "learner.pt").write_bytes(b"half")
    trash = tmp_path / ".trash-ckpt-000000-cafe"
    trash.mkdir()
    (trash / "x").write_bytes(b"x")
    assert store.latest_valid(tmp_path).index == 1          # never mistaken for a checkpoint
    removed = store.remove_staging(tmp_path)
    assert sorted(p.name for p in removed) == [".staging-000002-deadbeef", ".trash-ckpt-000000-cafe"]
    assert names(tmp_path) == ["ckpt-000001"]
    assert store.remove_staging(tmp_path) == [] and store.remove_staging(tmp_path / "no") == []


# ---------------------------------------------------------------- prune
def test_prune_keeps_the_newest_n(tmp_path):
    ckpts = write(tmp_path, 5)
    removed = store.prune(tmp_path, keep=2)
    assert removed == [ckpts[2].path, ckpts[1].path, ckpts[0].path]
    assert names(tmp_path) == ["ckpt-000004", "ckpt-000005"]
    assert store.prune(tmp_path, keep=2) == []
    (new,) = write(tmp_path, 1)
    assert new.index == 6


def test_prune_interrupted_midway_never_leaves_a_checkpoint_lookalike(tmp_path, monkeypatch):
    ckpts = write(tmp_path, 3)

    def crash_after_one_file(path, ignore_errors=False):
        next(iter(sorted(path.iterdir()))).unlink()   # half deleted ... then the process dies
        raise KeyboardInterrupt

    monkeypatch.setattr(store.shutil, "rmtree", crash_after_one_file)
    with pytest.raises(KeyboardInterrupt):
        store.prune(tmp_path, keep=1)
    monkeypatch.undo()
    listed = store.list_checkpoints(tmp_path)
    assert [p.name for p in listed] == ["ckpt-000003", "ckpt-000001"]  # ckpt-2 went first
    assert all(store.verify(p) for p in listed)               # what is listed is whole
    assert not (tmp_path / "ckpt-000002").exists()
    assert [p.name.startswith(".trash-ckpt-000002-") for p in store.remove_staging(tmp_path)] == [True]
    assert store.latest_valid(tmp_path).path == ckpts[2].path


# ---------------------------------------------------------------- read_checkpoint_file
def test_read_checkpoint_file(tmp_path):
    (ckpt,) = write(tmp_path, 1)
    assert store.read_checkpoint_file(ckpt.path, "learner.pt") == FILES["learner.pt"] + b"0"
    assert store.read_checkpoint_file(str(ckpt.path), "config.toml") == b"[ppo]\n0"


def test_read_checkpoint_file_refuses_a_changed_file(tmp_path):
    (ckpt,) = write(tmp_path, 1)
    (ckpt.path / "learner.pt").write_bytes(b"changed")
    with pytest.raises(CheckpointError, match=r"learner\.pt does not match"):
        store.read_checkpoint_file(ckpt.path, "learner.pt")


def test_read_checkpoint_file_unknown_name(tmp_path):
    (ckpt,) = write(tmp_path, 1)
    (ckpt.path / "extra.bin").write_bytes(b"not in the manifest")
    with pytest.raises(CheckpointError, match=r"has no extra\.bin"):
        store.read_checkpoint_file(ckpt.path, "extra.bin")


def test_read_checkpoint_file_returns_the_bytes_it_verified(tmp_path, monkeypatch):
    """The data handed back is the data whose sha256 was checked, not a second read."""
    (ckpt,) = write(tmp_path, 1)
    real_verify = store.read_manifest

    def verify_then_tamper(path):
        result = real_verify(path)
        (path / "learner.pt").write_bytes(b"swapped after verification")
        return result

    monkeypatch.setattr(store, "read_manifest", verify_then_tamper)
    try:
        data = store.read_checkpoint_file(ckpt.path, "learner.pt")
    except CheckpointError:
        return                                                 # refusing is also correct
    assert data == FILES["learner.pt"] + b"0"


def test_checkpoint_dirs_are_fsynced(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(store.os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    store.write_checkpoint(tmp_path, FILES, {})
    assert len(synced) == len(FILES) + 1 + 2   # each file, the manifest, staging dir, parent


def test_manifest_without_files_has_no_files(tmp_path):
    ckpt = store.write_checkpoint(tmp_path, {}, {})
    assert ckpt.manifest["files"] == {}
    manifest = ckpt.path / "manifest.json"
    m = json.loads(manifest.read_text())
    del m["files"]
    manifest.write_text(json.dumps(m))
    assert store.verify(ckpt.path).index == 1
    with pytest.raises(CheckpointError, match=r"has no learner\.pt"):
        store.read_checkpoint_file(ckpt.path, "learner.pt")


# ---------------------------------------------------------------- serve --fresh
def test_set_aside_moves_every_checkpoint_out_of_reach(tmp_path):
    root = tmp_path / "checkpoints"
    assert store.set_aside(root) is None  # (nothing yet)
    write(root, 3)
    aside = store.set_aside(root, now_s=0.0)
    assert aside == root / "previous-19700101T000000Z"
    assert names(aside) == ["ckpt-000001", "ckpt-000002", "ckpt-000003"]
    assert store.latest_valid(root) is None and store.list_checkpoints(root) == []
    assert store.write_checkpoint(root, FILES, {"weights_seq_no": 0}).index == 1  # the new run's first
    assert store.set_aside(root, now_s=0.0) == root / "previous-19700101T000000Z-2"
    assert store.prune(root, keep=0) == [] and (aside / "ckpt-000003").is_dir()


@pytest.mark.parametrize("world_size, rank, fresh, resumes", [
    (1, 0, False, True), (2, 0, False, True), (2, 1, False, False), (1, 0, True, False)])
def test_only_a_checkpoint_writer_resumes_its_state_dirs_checkpoints(tmp_path, world_size, rank, fresh,
                                                                     resumes):
    """A rank other than 0 of a job writes no checkpoints: any in its state dir are of
    another run (it ran alone, or was rank 0 of another job), and it is not resumed."""
    from types import SimpleNamespace

    from rlinkd.daemon.config import ClusterConfig
    from rlinkd.daemon.supervisor import Supervisor
    root = tmp_path / "checkpoints"
    written = store.write_checkpoint(root, {"x": b"1"}, {"weights_seq_no": 3})
    sup = object.__new__(Supervisor)
    sup.fresh = fresh
    sup.cfg = SimpleNamespace(cluster=ClusterConfig(world_size=world_size, rank=rank, master="127.0.0.1:1"))
    got = sup._checkpoint_to_resume(root)
    assert (got.path if got else None) == (written.path if resumes else None)


def test_reading_one_file_checks_that_file_without_hashing_the_others(tmp_path, monkeypatch):
    """read_checkpoint_file (the roles' reads at boot) checks the manifest and the file it
    returns, not every file again (a saved replay can be large): verify still checks all."""
    ckpt = store.write_checkpoint(tmp_path, {"learner.pt": b"L" * 10, "replay.bin": b"R" * 1000}, {})
    hashed: list[int] = []
    real = hashlib.sha256
    monkeypatch.setattr(store.hashlib, "sha256", lambda data=b"": hashed.append(len(data)) or real(data))
    assert store.read_checkpoint_file(ckpt.path, "learner.pt") == b"L" * 10
    assert hashed == [10]
    (ckpt.path / "replay.bin").write_bytes(b"X" * 1000)
    assert store.read_checkpoint_file(ckpt.path, "learner.pt") == b"L" * 10
    with pytest.raises(CheckpointError, match=r"replay\.bin"):
        store.read_checkpoint_file(ckpt.path, "replay.bin")
    with pytest.raises(CheckpointError, match="corrupt"):
        store.verify(ckpt.path)
