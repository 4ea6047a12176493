"""A policy's learner state read back from a checkpoint (both learner shells resume with it).

A checkpoint the config's network fits (the supervisor checks spaces and network, exit 78)
may still hold another algorithm's state (PPO's resumed with ``learner.algorithm = dqn``) or
another SAC alpha setting: the core refuses it (ValueError), and that is a boot error, not a
crash: a restart would read the same checkpoint again.
"""
from __future__ import annotations

import io
from typing import Any, Protocol

from rlinkd.daemon.checkpoint.store import policy_file, read_checkpoint_file
from rlinkd.daemon.roles import BootError


class StateLoader(Protocol):
    def load_state_dict(self, d: dict) -> dict[str, float]: ...


def resume_state(core: StateLoader, path: str, policy: str) -> tuple[dict[str, Any], dict[str, float]]:
    """(the checkpoint's payload for ``policy``, the hyperparameters it was saved with) after
    loading its learner state into ``core``; BootError naming the policy, the checkpoint and
    the way out when ``core`` refuses the state."""
    import torch
    payload = read_checkpoint_file(path, policy_file(policy, "learner.pt"))
    state = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
    try:
        saved = core.load_state_dict(state["learner"])
    except (ValueError, KeyError) as exc:
        raise BootError(f"cannot resume policy {policy!r} from {path}: {exc} (the checkpoint was "
                        f"trained with another learner.algorithm or setting: restore the config, "
                        f"or start with --fresh to ignore checkpoints)") from None
    return state, saved
