"""The recurrent cell of a policy with memory: the state contract and its numpy maths.

A recurrent network (`PolicySpec.recurrent` "lstm" or "gru", `recurrent_size` H) runs one cell
between the observation encoders and the actor/critic trunks (`netops.lower`). One step maps
(observation, state) to (outputs, new state); the state is ONE float32 tensor per agent:

    input  "state_in"   [batch, S]    the state after the agent's previous step
    output "state_out"  [batch, S]    the state to feed with the agent's next step
    LSTM: S = 2H, columns [h | c] (hidden, then cell);  GRU: S = H, columns [h]

(one tensor, as ML-Agents' memories, so a client keeps one array per agent whatever the cell).
batch is the only dynamic dimension. Reset contract: the side that acts feeds zeros as
"state_in" on the first step of every episode (after a reset, or a new agent) and otherwise
the "state_out" of that agent's previous step; the graph itself never resets. The actor and
the critic share the cell (the trunks read its new h).

Training data (a fragment of T steps of one episode, `fragments.Fragment.state_in`, wire key
"state_in"): the actor's state before steps 0, L, 2L, ... of the fragment, L = the policy's
`max_seq_len`: ceil(T / L) rows [K, S] (`state_rows`). The learner trains on chunks of at
most L steps cut on that grid, each started from the state the actor really had (zeros where
the chunk starts an episode); a fragment the daemon has to cut between two samples is cut
on the grid, so no chunk ever needs a state nobody sent. Bytes: S floats per L steps (an LSTM
of 64 with L = 20: 25.6 B per step), not S per step; exact however fragments are cut.

Gate maths are PyTorch's (nn.LSTMCell / nn.GRUCell), weights in their layout:
    gates_ih = x @ weight_ih.T + bias_ih, gates_hh = h @ weight_hh.T + bias_hh
    LSTM (gate blocks i, f, g, o of H rows each):
        i, f, o = sigmoid(.), g = tanh(.) of gates_ih + gates_hh
        c' = f * c + i * g;  h' = o * tanh(c')
    GRU (gate blocks r, z, n):
        r = sigmoid(ih_r + hh_r), z = sigmoid(ih_z + hh_z), n = tanh(ih_n + r * hh_n)
        h' = (1 - z) * n + z * h
numpy only (the torch twin is rlinkd.daemon.learner.recurrent, the ONNX one in netonnx).
"""
from __future__ import annotations

import numpy as np

CELLS = ("lstm", "gru")
GATES = {"lstm": 4, "gru": 3}
STATE_IN = "state_in"         # the graph input (and later wire key) of the state before a step
STATE_OUT = "state_out"       # ... and the output after it


def state_width(cell: str, size: int) -> int:
    """S, the width of "state_in"/"state_out", for `cell` with hidden size `size`."""
    return 2 * size if cell == "lstm" else size


def state_rows(num_steps: int, max_seq_len: int) -> int:
    """K, the rows of a T-step fragment's "state_in": one per started chunk of max_seq_len."""
    return -(-num_steps // max_seq_len)


def state_contract(cell: str, size: int, max_seq_len: int) -> dict:
    """The state's description as JSON-safe data (the export sidecar's "state", the
    additive "state" key of SET_CONFIG/ATTACHED): names, shape, column layout, the reset
    rule and the training fragments' state grid."""
    return {"cell": cell, "recurrent_size": size, "input": STATE_IN, "output": STATE_OUT,
            "shape": ["batch", state_width(cell, size)],
            "columns": ["h", "c"] if cell == "lstm" else ["h"],
            "reset": "zeros on the first step of every episode",
            "max_seq_len": max_seq_len,
            "fragment_state_in": "the state before steps 0, max_seq_len, 2*max_seq_len, ... "
                                 "of the fragment"}


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.float32(0.5) * (np.tanh(np.float32(0.5) * x) + np.float32(1.0))  # overflow-free


def lstm_step(x: np.ndarray, state: np.ndarray, w_ih_t: np.ndarray, w_hh_t: np.ndarray,
              b_ih: np.ndarray, b_hh: np.ndarray) -> np.ndarray:
    """x [N, F], state [N, 2H] = [h | c], weights transposed ([F, 4H], [H, 4H]) -> [N, 2H]."""
    size = w_hh_t.shape[0]
    h, c = state[:, :size], state[:, size:]
    gates = x @ w_ih_t + b_ih + h @ w_hh_t + b_hh                          # [N, 4H]
    s = _sigmoid(gates)                                                    # i, f, (unused), o
    c_new = s[:, size:2 * size] * c + s[:, :size] * np.tanh(gates[:, 2 * size:3 * size])
    return np.concatenate([s[:, 3 * size:] * np.tanh(c_new), c_new], axis=1)


def gru_step(x: np.ndarray, state: np.ndarray, w_ih_t: np.ndarray, w_hh_t: np.ndarray,
             b_ih: np.ndarray, b_hh: np.ndarray) -> np.ndarray:
    """x [N, F], state [N, H] = [h], weights transposed ([F, 3H], [H, 3H]) -> [N, H]."""
    size = w_hh_t.shape[0]
    gi, gh = x @ w_ih_t + b_ih, state @ w_hh_t + b_hh                      # [N, 3H] each
    r = _sigmoid(gi[:, :size] + gh[:, :size])
    z = _sigmoid(gi[:, size:2 * size] + gh[:, size:2 * size])
    n = np.tanh(gi[:, 2 * size:] + r * gh[:, 2 * size:])
    return (np.float32(1.0) - z) * n + z * state


STEPS = {"lstm": lstm_step, "gru": gru_step}


def check_state(state: np.ndarray, rows: int, width: int) -> np.ndarray:
    """`state` as float32 [rows, width]; ValueError on another shape or a non-finite value."""
    arr = np.asarray(state, np.float32)
    if arr.shape != (rows, width):
        raise ValueError(f"state_in has shape {arr.shape}, expected ({rows}, {width})")
    if not np.isfinite(arr).all():
        raise ValueError("state_in contains NaN or inf")
    return arr
