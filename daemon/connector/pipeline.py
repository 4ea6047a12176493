"""The learner connector pipeline: composable pieces turning segments into a train batch.

In the spirit of RLlib's ConnectorV2: a pipeline is a list of pieces; each piece is
a callable ``piece(batch, segments, ctx) -> batch`` that may read every segment and
add or change batch columns. The default order::

    observations → columns → old_logp → values → gae → normalize_advantages

Users add their own piece by import path in the config
(``[connector] pipeline = [..., "mypkg.pieces:ClipRewards", ...]``); the class is
instantiated with no arguments. Pieces run in the connector process (numpy only:
values and log-probs come from the weights board via ``client_lib.protocol.policy_spec``).

Batch columns produced (rows = steps): obs [N, O], actions [N, A], rewards [N],
logp [N], values [N], next_values [N], terminated [N], segment_end [N],
advantages [N], value_targets [N].
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlinkd.client_lib.protocol import policy_spec as ps
from rlinkd.client_lib.protocol.spaces import SpaceSpec, to_features
from rlinkd.daemon.connector.gae import compute_gae
from rlinkd.daemon.connector.segments import Segment, obs_values
from rlinkd.daemon.errors import ConfigError

Batch = dict[str, np.ndarray]
Piece = Callable[[Batch, list[Segment], "PipelineContext"], Batch]


@dataclass
class PipelineContext:
    """What pieces may use: spaces, the network spec, current weights, PPO constants."""

    obs_space: SpaceSpec
    act_space: SpaceSpec
    spec: ps.PolicySpec
    weights: np.ndarray
    weights_seq_no: int
    gamma: float
    gae_lambda: float
    normalize_advantages: bool


def add_observations(batch: Batch, segments: list[Segment], ctx: PipelineContext) -> Batch:
    """obs [N, O] features of every acting step; final_obs [S, O] for bootstrapping."""
    obs = [obs_values(s.obs) for s in segments]
    batch["obs"] = np.concatenate([to_features(o[:-1], ctx.obs_space) for o in obs])
    batch["final_obs"] = np.concatenate([to_features(o[-1:], ctx.obs_space) for o in obs])
    return batch


def add_columns(batch: Batch, segments: list[Segment], ctx: PipelineContext) -> Batch:
    """actions, rewards, per-step terminated / segment_end flags."""
    batch["actions"] = np.concatenate([s.actions for s in segments]).astype(np.float32)
    batch["rewards"] = np.concatenate([s.rewards for s in segments]).astype(np.float32)
    lengths = np.array([s.num_steps for s in segments])
    ends = np.cumsum(lengths) - 1                                   # [S] last row of each
    segment_end = np.zeros(int(lengths.sum()), bool)
    segment_end[ends] = True
    terminated = np.zeros_like(segment_end)
    terminated[ends] = [s.terminated for s in segments]
    batch["segment_end"], batch["terminated"] = segment_end, terminated
    batch["segment_lengths"] = lengths
    return batch


def add_old_logp(batch: Batch, segments: list[Segment], ctx: PipelineContext) -> Batch:
    """Behaviour log-probs from the clients; recomputed with current weights where absent."""
    logp = np.concatenate([s.logp for s in segments]).astype(np.float32)
    has = np.concatenate([s.has_logp for s in segments])
    if not has.all():
        missing = ~has
        dist = ps.actor_forward(ctx.spec, ctx.weights, batch["obs"][missing])
        actions = _policy_actions(batch["actions"][missing], ctx)
        logp[missing] = ps.log_prob(ctx.spec, dist, actions)
    batch["logp"] = logp
    return batch


def add_values(batch: Batch, segments: list[Segment], ctx: PipelineContext) -> Batch:
    """values [N] = V(s_t); next_values [N] = V(s_{t+1}), V(final obs) at segment ends."""
    values = ps.value_forward(ctx.spec, ctx.weights, batch["obs"])
    final_values = ps.value_forward(ctx.spec, ctx.weights, batch["final_obs"])
    next_values = np.empty_like(values)
    next_values[:-1] = values[1:]
    next_values[batch["segment_end"]] = final_values
    batch["values"], batch["next_values"] = values, next_values
    return batch


def add_gae(batch: Batch, segments: list[Segment], ctx: PipelineContext) -> Batch:
    batch["advantages"], batch["value_targets"] = compute_gae(
        batch["rewards"], batch["values"], batch["next_values"], batch["terminated"],
        batch["segment_end"], ctx.gamma, ctx.gae_lambda)
    return batch


def normalize_advantages(batch: Batch, segments: list[Segment], ctx: PipelineContext) -> Batch:
    if ctx.normalize_advantages and len(batch["advantages"]) > 1:
        adv = batch["advantages"]
        batch["advantages"] = ((adv - adv.mean()) / (adv.std() + 1e-8)).astype(np.float32)
    return batch


def _policy_actions(actions: np.ndarray, ctx: PipelineContext) -> np.ndarray:
    if ctx.act_space.is_discrete:
        return actions.reshape(-1).astype(np.int64)
    return actions


BUILTIN_PIECES: dict[str, Piece] = {
    "observations": add_observations, "columns": add_columns, "old_logp": add_old_logp,
    "values": add_values, "gae": add_gae, "normalize_advantages": normalize_advantages,
}


def load_piece(name: str) -> Piece:
    """A built-in piece by name, or ``module:Class`` instantiated with no arguments."""
    if name in BUILTIN_PIECES:
        return BUILTIN_PIECES[name]
    if ":" not in name:
        raise ConfigError(f"connector.pipeline: unknown piece {name!r} (built-ins: "
                          f"{', '.join(BUILTIN_PIECES)}; or module:Class)")
    module_name, attr = name.split(":", 1)
    try:
        obj: Any = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"connector.pipeline: cannot load {name!r}: {exc}") from None
    return obj() if isinstance(obj, type) else obj


class LearnerPipeline:
    """The configured pieces, called in order on a list of segments."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.pieces = [load_piece(n) for n in names]

    def __call__(self, segments: list[Segment], ctx: PipelineContext) -> Batch:
        batch: Batch = {}
        for piece in self.pieces:
            batch = piece(batch, segments, ctx)
        return batch
