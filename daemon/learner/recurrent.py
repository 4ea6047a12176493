"""Torch twin of `client_lib.protocol.recurrent`: the recurrent cell, one step and a sequence.

The state is one tensor [B, S] (LSTM: [h | c], S = 2H; GRU: [h], S = H); gate order and maths
are PyTorch's nn.LSTMCell / nn.GRUCell (a test checks these against them and against numpy).
`sequence` runs T steps with the state zeroed where an episode starts — the same reset the
acting side does — so training over a chunk reproduces the states the actor had.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional as F

Weights = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # w_ih, w_hh, b_ih, b_hh


def lstm_step(x: torch.Tensor, state: torch.Tensor, w: Weights) -> torch.Tensor:
    """x [B, F], state [B, 2H] -> [B, 2H]."""
    size = w[1].shape[1]
    h, c = state[:, :size], state[:, size:]
    gates = F.linear(x, w[0], w[2]) + F.linear(h, w[1], w[3])            # [B, 4H]
    i, f, g, o = gates.chunk(4, dim=1)
    c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.cat([torch.sigmoid(o) * torch.tanh(c_new), c_new], dim=1)


def gru_step(x: torch.Tensor, state: torch.Tensor, w: Weights) -> torch.Tensor:
    """x [B, F], state [B, H] -> [B, H]."""
    gi, gh = F.linear(x, w[0], w[2]), F.linear(state, w[1], w[3])        # [B, 3H] each
    i_r, i_z, i_n = gi.chunk(3, dim=1)
    h_r, h_z, h_n = gh.chunk(3, dim=1)
    r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
    n = torch.tanh(i_n + r * h_n)
    return (1.0 - z) * n + z * state


STEPS: dict[str, Callable[[torch.Tensor, torch.Tensor, Weights], torch.Tensor]] = {
    "lstm": lstm_step, "gru": gru_step}


def sequence(cell: str, x: torch.Tensor, state0: torch.Tensor, starts: torch.Tensor,
             w: Weights) -> torch.Tensor:
    """The states after each of T steps: x [T, B, F], state0 [B, S] (the state before step 0),
    starts [T, B] (1 where step t begins an episode: the state is zeroed before it) ->
    [T, B, S]. Gradients flow through the whole chunk (truncated BPTT at its edges)."""
    step, state, out = STEPS[cell], state0, []
    keep = 1.0 - starts.to(x.dtype)                                      # [T, B]
    for t in range(x.shape[0]):
        state = step(x[t], state * keep[t, :, None], w)
        out.append(state)
    return torch.stack(out)
