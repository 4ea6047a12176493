"""The learner connector pipeline: composable pieces turning segments into a train batch.

In the spirit of RLlib's ConnectorV2: a pipeline is a list of pieces; each piece is
a callable ``piece(batch, segments, ctx) -> batch`` that may read every segment and
add or change batch columns. The default order::

    observations → columns → old_logp → values → gae → normalize_advantages

Users add their own piece by import path in the config
(``[connector] pipeline = [..., "mypkg.pieces:ClipRewards", ...]``); the class is
instantiated with no arguments. Pieces run in the connector process (numpy only:
values and log-probs come from the weights board via ``client_lib.protocol.policy_spec``).

Batch columns produced (rows = steps): obs (leaf key -> [N, *leaf shape], each leaf in its
record dtype), actions [N, A], rewards [N], logp [N], values [N], next_values [N],
terminated [N], segment_end [N], advantages [N], value_targets [N]; final_obs (leaf key ->
[S, ...]: the bootstrap observation of each segment). A recurrent policy's pipeline also runs
``sequences`` after ``columns`` (``pipeline_for``): seq_start [N], seq_state [N, S],
episode_start [N] (``connector.sequences``), and the network then runs over those chunks
from the stored states (values, recomputed log-probs, V-trace's pi, the bootstrap values).
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlinkd.client_lib.protocol import policy_spec as ps
from rlinkd.client_lib.protocol.records import obs_columns
from rlinkd.client_lib.protocol.spaces import Space
from rlinkd.daemon.connector.forward import BatchForward
from rlinkd.daemon.connector import sequences as seqs
from rlinkd.daemon.connector.gae import compute_gae
from rlinkd.daemon.connector.vtrace import compute_vtrace
from rlinkd.daemon.connector.segments import Segment
from rlinkd.daemon.errors import ConfigError

Batch = dict[str, Any]
Piece = Callable[[Batch, list[Segment], "PipelineContext"], Batch]


@dataclass
class PipelineContext:
    """What pieces may use: spaces, the network spec, current weights, PPO constants."""

    obs_space: Space
    act_space: Space
    spec: ps.PolicySpec
    weights: np.ndarray
    weights_seq_no: int
    gamma: float
    gae_lambda: float
    normalize_advantages: bool
    forward: BatchForward | None = None  # the network on ``weights``; made on first use
    vtrace_rho_clip: float = 1.0         # APPO's V-trace clips (``vtrace`` piece)
    vtrace_c_clip: float = 1.0

    def net(self) -> BatchForward:
        """The network on ``weights`` (numpy, or onnxruntime for CNNs: ``connector.forward``)."""
        if self.forward is None:
            self.forward = BatchForward(self.spec, self.weights)
        return self.forward


def add_observations(batch: Batch, segments: list[Segment], ctx: PipelineContext) -> Batch:
    """obs: leaf columns [N, ...] of every acting step; final_obs [S, ...] for bootstrapping."""
    steps = np.concatenate([s.obs[:-1] for s in segments])   # structured [N]
    finals = np.concatenate([s.obs[-1:] for s in segments])  # structured [S]
    batch["obs"] = {k: np.ascontiguousarray(v) for k, v in _leaves(steps, ctx).items()}
    batch["final_obs"] = {k: np.ascontiguousarray(v) for k, v in _leaves(finals, ctx).items()}
    return batch


def _leaves(obs: np.ndarray, ctx: PipelineContext) -> dict[str, np.ndarray]:
    """A structured obs array (the records' obs field) as leaf columns."""
    return obs_columns(obs, ctx.obs_space)


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


def add_sequences(batch: Batch, segments: list[Segment], ctx: PipelineContext) -> Batch:
    """A recurrent policy's chunks (``connector.sequences``): seq_start [N], seq_state [N, S]
    (the actor's state before each chunk), episode_start [N], as float32 columns."""
    has_state = np.concatenate([s.has_state for s in segments])
    states = np.concatenate([s.states for s in segments])
    start = seqs.chunk_starts(batch["segment_lengths"], has_state, ctx.spec.max_seq_len)
    batch["seq_state"] = seqs.start_states(states, has_state, start)
    batch["episode_start"] = seqs.episode_starts(batch["segment_lengths"], batch["seq_state"]
                                                 ).astype(np.float32)
    batch["seq_start"] = start.astype(np.float32)
    return batch


def recurrent_outputs(batch: Batch, ctx: PipelineContext) -> dict[str, np.ndarray]:
    """A recurrent network's dist inputs [N, D], values [N] and bootstrap values [S] over the
    batch's chunks (``add_sequences`` ran), computed once per batch and kept in it."""
    if "recurrent_outputs" not in batch:
        index = seqs.chunk_index(batch["seq_start"], ctx.spec.max_seq_len)       # [C, L]
        dist, values, after = ctx.net().run_sequences(
            batch["obs"], index, batch["seq_state"][index[:, 0]], batch["episode_start"])
        final = ctx.net().final_values(batch["final_obs"], after[batch["segment_end"]])
        batch["recurrent_outputs"] = {"dist": dist, "values": values, "final_values": final}
    return batch["recurrent_outputs"]


def _dist(batch: Batch, rows: np.ndarray, ctx: PipelineContext) -> np.ndarray:
    """Dist inputs [n, D] of the rows ``rows`` (a bool mask) under the context's weights."""
    if ctx.spec.state_size:
        return recurrent_outputs(batch, ctx)["dist"][rows]
    return ctx.net().run({k: v[rows] for k, v in batch["obs"].items()})[0]


def add_old_logp(batch: Batch, segments: list[Segment], ctx: PipelineContext) -> Batch:
    """Behaviour log-probs from the clients; recomputed with current weights where absent."""
    logp = np.concatenate([s.logp for s in segments]).astype(np.float32)
    has = np.concatenate([s.has_logp for s in segments])
    if not has.all():
        missing = ~has
        logp[missing] = ctx.spec.log_prob(_dist(batch, missing, ctx), batch["actions"][missing])
    batch["logp"] = logp
    return batch


def add_values(batch: Batch, segments: list[Segment], ctx: PipelineContext) -> Batch:
    """values [N] = V(s_t); next_values [N] = V(s_{t+1}), V(final obs) at segment ends."""
    if ctx.spec.state_size:
        out = recurrent_outputs(batch, ctx)
        values, final_values = out["values"], out["final_values"]
    else:
        values = ctx.net().run(batch["obs"])[1]
        final_values = ctx.net().run(batch["final_obs"])[1]
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


def add_vtrace(batch: Batch, segments: list[Segment], ctx: PipelineContext) -> Batch:
    """APPO's replacement of ``gae``: advantages and value targets by V-trace, the clients'
    log-probs (mu) kept as behaviour_logp, ``logp`` set to the current weights' (pi: the
    PPO ratio of the update's first minibatch is then 1)."""
    dist = _dist(batch, np.ones(len(batch["actions"]), bool), ctx)
    target_logp = ctx.spec.log_prob(dist, batch["actions"]).astype(np.float32)
    batch["advantages"], batch["value_targets"] = compute_vtrace(
        batch["rewards"], batch["values"], batch["next_values"], batch["terminated"],
        batch["segment_end"], target_logp - batch["logp"], ctx.gamma, ctx.gae_lambda,
        ctx.vtrace_rho_clip, ctx.vtrace_c_clip)
    batch["behaviour_logp"], batch["logp"] = batch["logp"], target_logp
    return batch


def normalize_advantages(batch: Batch, segments: list[Segment], ctx: PipelineContext) -> Batch:
    if ctx.normalize_advantages and len(batch["advantages"]) > 1:
        adv = batch["advantages"]
        batch["advantages"] = ((adv - adv.mean()) / (adv.std() + 1e-8)).astype(np.float32)
    return batch


BUILTIN_PIECES: dict[str, Piece] = {
    "observations": add_observations, "columns": add_columns, "sequences": add_sequences,
    "old_logp": add_old_logp,
    "values": add_values, "gae": add_gae, "vtrace": add_vtrace,
    "normalize_advantages": normalize_advantages,
}


def pipeline_for(names: tuple[str, ...], algorithm: str, recurrent: bool = False) -> tuple[str, ...]:
    """The configured pieces, with ``gae`` replaced by ``vtrace`` for an APPO policy, and
    ``sequences`` after ``columns`` for a recurrent one."""
    if algorithm == "appo":
        names = tuple("vtrace" if name == "gae" else name for name in names)
    if recurrent and "sequences" not in names:
        at = names.index("columns") + 1 if "columns" in names else 0
        names = (*names[:at], "sequences", *names[at:])
    return names


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
