"""Truncated back-propagation through time for a recurrent policy's PPO/APPO update.

The batch's rows are cut into chunks of at most L = max_seq_len steps (``connector.sequences``;
per-row columns seq_start, seq_state, episode_start). The update's unit is a chunk, not a row:
a minibatch is b chunks, the network runs over them time-major from their stored start states
(``ActorCritic.run_sequence``: gradients flow through the whole chunk and stop at its edges),
and every loss is a mean over the real steps only (padding masked). Advantages and value
targets are the connector's per-row GAE / V-trace, computed before chunking.

Shapes: N rows, C chunks, L steps per chunk, b chunks per minibatch, S state width.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlinkd.client_lib.protocol import netops as N
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.daemon.batch_schema import SEQUENCE_COLUMN_NAMES
from rlinkd.daemon.connector.sequences import chunk_index

SEQ = "sequences"  # the update data's key holding the chunk tensors below


def sequence_arrays(batch: dict[str, Any], spec: PolicySpec, rows: int) -> dict[str, np.ndarray]:
    """The chunks of a batch as arrays: rows [C, L] int64 (padding points at row 0), mask
    [C, L] (1 on real steps), state0 [C, S] (the actor's state before each chunk), starts
    [C, L] (1 where an episode begins). ValueError on missing, misshapen or non-finite columns
    or a chunk longer than max_seq_len."""
    missing = [k for k in SEQUENCE_COLUMN_NAMES if k not in batch]
    if missing:
        raise ValueError(f"a recurrent policy's batch is missing {missing}")
    seq_state = np.asarray(batch["seq_state"], np.float32)
    if seq_state.shape != (rows, spec.state_size) or not np.isfinite(seq_state).all():
        raise ValueError(f"seq_state must be finite [{rows}, {spec.state_size}], got {seq_state.shape}")
    index = chunk_index(np.asarray(batch["seq_start"]).reshape(rows), spec.max_seq_len)  # [C, L]
    starts = np.asarray(batch["episode_start"], np.float32).reshape(rows)
    return {"rows": np.maximum(index, 0), "mask": (index >= 0).astype(np.float32),
            "state0": seq_state[index[:, 0]],
            "starts": np.where(index >= 0, starts[np.maximum(index, 0)], 0.0).astype(np.float32)}


def chunks_per_minibatch(minibatch_size: int, max_seq_len: int) -> int:
    """b: as many whole chunks as minibatch_size rows hold (at least one)."""
    return max(1, minibatch_size // max_seq_len)


def gather(data: dict[str, Any], idx: torch.Tensor, obs_key: str
           ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The minibatch of chunks ``idx`` [b]: (per-row columns [L*b] time-major, observation
    leaves [L, b, ...], chunk tensors: mask [L*b], state0 [b, S], starts [L, b])."""
    seq = data[SEQ]
    rows = seq["rows"][idx].transpose(0, 1)                              # [L, b]
    flat = rows.reshape(-1)                                              # [L*b]
    mb = {k: v[flat] for k, v in data.items() if k not in (obs_key, SEQ)}
    obs = {k: v[flat].reshape(*rows.shape, *v.shape[1:]) for k, v in data[obs_key].items()}
    chunk = {"mask": seq["mask"][idx].transpose(0, 1).reshape(-1),      # [L*b]
             "state0": seq["state0"][idx],                              # [b, S]
             "starts": seq["starts"][idx].transpose(0, 1)}              # [L, b]
    return mb, obs, chunk


def evaluate_sequences(model: Any, obs: dict[str, torch.Tensor], chunk: dict[str, torch.Tensor],
                       actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log pi(a|s) [L*b], entropy [L*b], V(s) [L*b]) over the chunks from their start states;
    actions [L*b, A]. Padded steps produce numbers too: the mask drops them from the loss."""
    dist, value = model.run_sequence(obs, chunk["state0"], chunk["starts"], (N.DIST, N.VALUE))
    steps = chunk["starts"].numel()
    logp, entropy = model.dist.log_prob_entropy(dist.reshape(steps, -1), actions)
    return logp, entropy, value.reshape(steps)
