"""Action distributions from `action_dist_inputs`, numpy side (the torch twin is in
`rlinkd.daemon.learner.model`). Both read the same `components(act_space)` list.

An action space is a product of components, one per action leaf (MultiDiscrete: one per
entry); log-prob and entropy are sums over components. Actions are float32 [N, action_size]
index vectors (Discrete/MultiDiscrete: the 0-based index, value - start; MultiBinary 0/1;
Box: floats). Components and their columns:

    categorical  (Discrete n; each MultiDiscrete entry)   dist: n logits      action: 1 index
    bernoulli    (MultiBinary n)                          dist: n logits      action: n bits
    gaussian     (float Box, d = prod(shape))             dist: d means then d log-stds
                                                          action: d values (samples clipped
                                                          to [low, high]; log-prob evaluated
                                                          at the clipped value, no squashing)
A masked categorical logit is MASKED_LOGIT (-1e9): its probability is exactly 0 here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlinkd.client_lib.protocol.netops import family

LOG_2PI = math.log(2.0 * math.pi)


@dataclass(frozen=True)
class Component:
    """One factor of the action distribution: columns [dist, dist + width) of the dist inputs
    (gaussian: means there, log-stds at [dist + width, dist + 2*width)), action columns
    [action, action + 1) for categorical, [action, action + width) otherwise."""
    kind: str
    dist: int
    width: int
    action: int
    low: tuple[float, ...] = ()
    high: tuple[float, ...] = ()


def components(act_space: Any) -> tuple[Component, ...]:
    """The components of an action space, in leaf order. ValueError on an integer Box."""
    out: list[Component] = []
    dist = action = 0
    for leaf in act_space.leaves():
        space, fam = leaf.space, family(leaf.space)
        if fam in ("discrete", "multi_discrete"):
            nvec = (int(space.n),) if fam == "discrete" else tuple(int(n) for n in space.nvec)
            for n in nvec:
                out.append(Component("categorical", dist, n, action))
                dist, action = dist + n, action + 1
        elif fam == "multi_binary":
            out.append(Component("bernoulli", dist, int(space.n), action))
            dist, action = dist + space.n, action + space.n
        else:
            if np.dtype(space.dtype).kind != "f":
                raise ValueError(f"{leaf.display('action')}: integer/bool Box actions "
                                 f"are not supported (use Discrete/MultiDiscrete/MultiBinary)")
            d = math.prod(space.shape)
            low = tuple(float(v) for v in np.asarray(space.low, np.float64).reshape(-1))
            high = tuple(float(v) for v in np.asarray(space.high, np.float64).reshape(-1))
            out.append(Component("gaussian", dist, d, action, low, high))
            dist, action = dist + 2 * d, action + d
    return tuple(out)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, np.float64)
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


class ActionDist:
    """numpy sample / greedy / log_prob / entropy over `components`; inputs [N, dist_size]."""

    def __init__(self, comps: tuple[Component, ...]) -> None:
        self.comps = comps
        self.action_size = sum(1 if c.kind == "categorical" else c.width for c in comps)

    def _cols(self, c: Component, d: np.ndarray) -> np.ndarray:
        return np.asarray(d[:, c.dist:c.dist + c.width], np.float64)

    def sample(self, dist_inputs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """float32 [N, action_size]: one draw per row (masked choices never drawn)."""
        out = np.empty((len(dist_inputs), self.action_size), np.float32)
        for c in self.comps:
            x = self._cols(c, dist_inputs)
            if c.kind == "categorical":
                out[:, c.action] = _sample_categorical(x, rng)
            elif c.kind == "bernoulli":
                out[:, c.action:c.action + c.width] = rng.random(x.shape) < 1.0 / (1.0 + np.exp(-x))
            else:
                log_std = np.asarray(dist_inputs[:, c.dist + c.width:c.dist + 2 * c.width])
                draw = x + np.exp(log_std) * rng.standard_normal(x.shape)
                out[:, c.action:c.action + c.width] = np.clip(draw, c.low, c.high)
        return out

    def greedy(self, dist_inputs: np.ndarray) -> np.ndarray:
        """float32 [N, action_size]: argmax, logit > 0, or the clipped mean."""
        out = np.empty((len(dist_inputs), self.action_size), np.float32)
        for c in self.comps:
            x = self._cols(c, dist_inputs)
            if c.kind == "categorical":
                out[:, c.action] = np.argmax(x, axis=1)
            elif c.kind == "bernoulli":
                out[:, c.action:c.action + c.width] = x > 0.0
            else:
                out[:, c.action:c.action + c.width] = np.clip(x, c.low, c.high)
        return out

    def log_prob(self, dist_inputs: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """log pi(a|s) [N] float32, summed over components; actions [N, action_size]."""
        a = np.asarray(actions, np.float64).reshape(len(dist_inputs), self.action_size)
        total = np.zeros(len(dist_inputs), np.float64)
        for c in self.comps:
            x = self._cols(c, dist_inputs)
            if c.kind == "categorical":
                idx = np.rint(a[:, c.action]).astype(np.int64)
                total += _log_softmax(x)[np.arange(len(x)), idx]
            elif c.kind == "bernoulli":
                total += (a[:, c.action:c.action + c.width] * x - _softplus(x)).sum(axis=1)
            else:
                log_std = np.asarray(dist_inputs[:, c.dist + c.width:c.dist + 2 * c.width],
                                     np.float64)
                z = (a[:, c.action:c.action + c.width] - x) / np.exp(log_std)
                total += (-0.5 * z**2 - log_std - 0.5 * LOG_2PI).sum(axis=1)
        return total.astype(np.float32)

    def entropy(self, dist_inputs: np.ndarray) -> np.ndarray:
        """Entropy [N] float32, summed over components."""
        total = np.zeros(len(dist_inputs), np.float64)
        for c in self.comps:
            x = self._cols(c, dist_inputs)
            if c.kind == "categorical":
                logp = _log_softmax(x)
                total -= (np.exp(logp) * logp).sum(axis=1)
            elif c.kind == "bernoulli":
                total += (_softplus(x) - x / (1.0 + np.exp(-x))).sum(axis=1)
            else:
                log_std = np.asarray(dist_inputs[:, c.dist + c.width:c.dist + 2 * c.width],
                                     np.float64)
                total += (log_std + 0.5 * (1.0 + LOG_2PI)).sum(axis=1)
        return total.astype(np.float32)


def _sample_categorical(logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Inverse-CDF draw per row; a zero-probability (masked) index is never returned."""
    p = np.exp(_log_softmax(logits))                      # [N, n]
    cdf = np.cumsum(p, axis=1)
    u = rng.random((len(p), 1)) * cdf[:, -1:]
    idx = (cdf <= u).sum(axis=1)
    last_positive = p.shape[1] - 1 - np.argmax(p[:, ::-1] > 0.0, axis=1)
    return np.minimum(idx, last_positive)
