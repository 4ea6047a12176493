"""Action masking: which discrete choices a step allows, sent by the simulator as a
MultiBinary observation leaf (config ``env.action_mask_key``, e.g. "action_mask").

The mask has one entry per categorical logit of the action space — the Discrete and
MultiDiscrete leaves in action-leaf order (Box and MultiBinary action leaves take none);
1 means legal. The network replaces every masked logit by ``MASKED_LOGIT`` (so sampling,
log-probs and entropy give masked choices zero probability and no gradient reaches them),
and the collector refuses a step whose action a client took against its own mask.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlinkd.client_lib.protocol.spaces import (Dict, Discrete, MultiBinary, MultiDiscrete, Space,
                                               SpaceError)

MASKED_LOGIT = -1e9
"""What a masked logit becomes (finite: exp underflows to exactly 0, and 0 * logit = 0)."""


@dataclass(frozen=True)
class MaskSpec:
    """Where a mask applies. ``components`` lists, per categorical action component:
    (its index in the action vector, its first mask entry, its number of choices).
    ``dist_positions`` [m]: for each mask entry, the column of the dist inputs it masks."""

    key: str
    components: tuple[tuple[int, int, int], ...]
    dist_positions: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.dist_positions)


def mask_spec(obs_space: Space, act_space: Space, key: str) -> MaskSpec | None:
    """The mask layout for ``key`` ("" = no masking); SpaceError when the observation has no
    such MultiBinary key or its size is not the number of categorical logits."""
    if not key:
        return None
    if not isinstance(obs_space, Dict) or key not in obs_space:
        raise SpaceError(f"action_mask_key {key!r}: the observation space must be a Dict "
                         f"with that key")
    leaf = obs_space[key]
    components, positions = _categorical_layout(act_space)
    if not components:
        raise SpaceError(f"action_mask_key {key!r}: the action space has no Discrete or "
                         f"MultiDiscrete part to mask")
    if not isinstance(leaf, MultiBinary) or leaf.shape != (len(positions),):
        raise SpaceError(f"action_mask_key {key!r}: must be MultiBinary({len(positions)}), one "
                         f"entry per discrete choice of the action space")
    return MaskSpec(key, tuple(components), tuple(positions))


def _categorical_layout(act_space: Space) -> tuple[list[tuple[int, int, int]], list[int]]:
    components: list[tuple[int, int, int]] = []
    positions: list[int] = []
    action_at = dist_at = 0
    for leaf in act_space.leaves():
        space = leaf.space
        sizes = ((space.n,) if isinstance(space, Discrete)
                 else space.nvec if isinstance(space, MultiDiscrete) else ())
        for i, n in enumerate(sizes):
            components.append((action_at + i, len(positions), n))
            positions.extend(range(dist_at, dist_at + n))
            dist_at += n
        if not sizes:
            dist_at += space.dist_width
        action_at += space.action_width
    return components, positions


def check_masks(masks: np.ndarray, spec: MaskSpec, what: str) -> str | None:
    """Every step's mask [T, m] must leave at least one choice per component."""
    for i, (_, first, n) in enumerate(spec.components):
        if len(masks) and not masks[:, first:first + n].any(axis=1).all():
            return f"{what}: a step allows no choice for discrete action component {i}"
    return None


def check_actions(masks: np.ndarray, actions: np.ndarray, spec: MaskSpec, what: str) -> str | None:
    """Actions [T, A] (indices) must be legal under the masks [T, m] of the same steps."""
    if not len(actions):
        return None
    rows = np.arange(len(actions))
    for i, (at, first, n) in enumerate(spec.components):
        index = np.clip(np.rint(actions[:, at]).astype(np.int64), 0, n - 1)
        illegal = masks[rows, first + index] == 0
        if illegal.any():
            step = int(np.flatnonzero(illegal)[0])
            return (f"{what}: step {step} takes choice {int(index[step])} of discrete action "
                    f"component {i}, which its action mask forbids")
    return None
