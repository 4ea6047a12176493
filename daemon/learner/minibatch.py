"""Static-shape minibatches: every SGD step of an update sees the same number of rows, so a
step can be captured once and replayed (and a CPU step allocates the same buffers each time).

Remainder rule: an epoch over N rows is K = ceil(N / B) minibatches of b = min(B, N) rows
(B = minibatch_size). When B does not divide N, the last minibatch is filled up with the
first K*b - N rows of that epoch's shuffle: those rows (fewer than B, a fresh random choice
every epoch) are trained twice in that epoch. A batch smaller than B is one minibatch of
all its rows.
"""
from __future__ import annotations

import numpy as np


def epoch_plan(perm: np.ndarray, minibatch_size: int) -> np.ndarray:
    """[K, b] row indices of one epoch from a permutation of the N rows (the rule above)."""
    n = len(perm)
    b = min(minibatch_size, n)
    k = -(-n // b)
    return np.concatenate([perm, perm[:k * b - n]]).reshape(k, b)


def update_plan(rng: np.random.Generator, n_rows: int, minibatch_size: int,
                epochs: int) -> np.ndarray:
    """[epochs, K, b] int64 indices: a fresh shuffle per epoch, drawn up front so that the
    whole plan crosses to the device at once (an epoch stopped early leaves its draws)."""
    return np.stack([epoch_plan(rng.permutation(n_rows), minibatch_size)
                     for _ in range(epochs)]).astype(np.int64)
