"""A replay buffer inside a checkpoint (``checkpoint.save_replay``): written by the
checkpointer with every checkpoint, read back by the supervisor into the new buffer of a
resuming daemon before any role starts (pure file logic; no processes).

    policies/<name>/replay.bin    the stored rows, oldest first, raw ``ReplayLayout.dtype`` bytes
    policies/<name>/replay.json   {"written": W, "rows": n, "layout": ReplayLayout.to_json()}
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rlinkd.daemon.checkpoint import store
from rlinkd.daemon.errors import CheckpointError
from rlinkd.shm.replay import ReplayBuffer, ReplayLayout

ROWS_FILE, META_FILE = "replay.bin", "replay.json"


def replay_files(policy: str, buffer: ReplayBuffer) -> dict[str, bytes]:
    """The buffer's rows and counters as checkpoint files (a consistent copy: rows the
    writer overwrote meanwhile are left out)."""
    rows, written = buffer.export()
    meta = {"written": written, "rows": len(rows), "layout": buffer.layout.to_json()}
    return {store.policy_file(policy, ROWS_FILE): rows.tobytes(),
            store.policy_file(policy, META_FILE): json.dumps(meta).encode()}


def restore_replay(checkpoint: str, policy: str, buffer: ReplayBuffer) -> int:
    """Refill ``buffer`` from the checkpoint's files of ``policy``; the rows restored (0
    when the checkpoint has none). CheckpointError when they do not fit this buffer's layout."""
    if store.policy_file(policy, META_FILE) not in store.read_manifest(Path(checkpoint)).manifest.get("files", {}):
        return 0
    meta = json.loads(store.read_checkpoint_file(checkpoint, store.policy_file(policy, META_FILE)))
    if ReplayLayout.from_json(meta["layout"]) != buffer.layout:
        raise CheckpointError(f"{checkpoint}: the saved replay of policy {policy!r} has another "
                              "row layout than this daemon's")
    data = store.read_checkpoint_file(checkpoint, store.policy_file(policy, ROWS_FILE))
    rows = np.frombuffer(data, buffer.layout.dtype)
    if len(rows) != meta["rows"]:
        raise CheckpointError(f"{checkpoint}: replay of policy {policy!r} is truncated")
    keep = rows[-buffer.capacity:]  # (a smaller buffer now: the newest rows)
    buffer.restore(keep.copy(), int(meta["written"]))
    return len(keep)
