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
    squashed_gaussian (float Box with finite bounds,      dist: d means then d log-stds of u
                      box_dist = "squashed_gaussian":     action: a = low + (tanh(u) + 1) / 2
                      SAC's policy)                       * (high - low), u ~ N(mean, std);
                                                          greedy: u = mean; log-prob with the
                                                          tanh change of variables; entropy:
                                                          that of the Gaussian before the tanh
A masked categorical logit is MASKED_LOGIT (-1e9): its probability is exactly 0 here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlinkd.client_lib.protocol.netops import family

LOG_2PI = math.log(2.0 * math.pi)
BOX_DISTS = ("gaussian", "squashed_gaussian")
"""How float Box actions are drawn: PPO's clipped Gaussian, or SAC's tanh-squashed one."""
SQUASH_EDGE = 1.0 - 1e-6  # |tanh(u)| is kept below this when an action is mapped back to u


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


def components(act_space: Any, box_dist: str = "gaussian") -> tuple[Component, ...]:
    """The components of an action space, in leaf order (float Boxes: `box_dist`, one of
    BOX_DISTS). ValueError on an integer Box, an unknown box_dist, or a squashed Box
    with an infinite bound."""
    if box_dist not in BOX_DISTS:
        raise ValueError(f"box_dist must be one of {BOX_DISTS}, not {box_dist!r}")
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
            if box_dist == "squashed_gaussian" and not np.isfinite(low + high).all():
                raise ValueError(f"{leaf.display('action')}: a squashed Gaussian needs finite "
                                 f"low and high bounds")
            out.append(Component(box_dist, dist, d, action, low, high))
            dist, action = dist + 2 * d, action + d
    return tuple(out)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, np.float64)
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def squash(c: Component, u: np.ndarray) -> np.ndarray:
    """Pre-squash values u [N, d] -> actions in [low, high]: low + (tanh(u) + 1) / 2 * (high - low)."""
    low, high = np.asarray(c.low), np.asarray(c.high)
    return low + (np.tanh(u) + 1.0) * 0.5 * (high - low)


def unsquash(c: Component, a: np.ndarray) -> np.ndarray:
    """The inverse of `squash` (actions at a bound map to atanh(SQUASH_EDGE))."""
    low, high = np.asarray(c.low), np.asarray(c.high)
    t = np.clip(2.0 * (np.asarray(a, np.float64) - low) / (high - low) - 1.0, -SQUASH_EDGE, SQUASH_EDGE)
    return np.arctanh(t)


def squash_log_det(c: Component, u: np.ndarray) -> np.ndarray:
    """log |da/du| summed over the component's columns [N]: log((high - low) / 2)
    + log(1 - tanh(u)^2), the latter as 2 * (log 2 - u - softplus(-2u)) (stable for large |u|)."""
    half_range = np.log(0.5 * (np.asarray(c.high) - np.asarray(c.low)))
    return (half_range + 2.0 * (math.log(2.0) - u - _softplus(-2.0 * u))).sum(axis=1)


def _gaussian_logp(z: np.ndarray, log_std: np.ndarray) -> np.ndarray:
    return (-0.5 * z**2 - log_std - 0.5 * LOG_2PI).sum(axis=1)


class ActionDist:
    """numpy sample / greedy / log_prob / entropy over `components`; inputs [N, dist_size]."""

    def __init__(self, comps: tuple[Component, ...]) -> None:
        self.comps = comps
        self.action_size = sum(1 if c.kind == "categorical" else c.width for c in comps)

    def _cols(self, c: Component, d: np.ndarray) -> np.ndarray:
        return np.asarray(d[:, c.dist:c.dist + c.width], np.float64)

    def _log_std(self, c: Component, d: np.ndarray) -> np.ndarray:
        return np.asarray(d[:, c.dist + c.width:c.dist + 2 * c.width], np.float64)

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
                draw = x + np.exp(self._log_std(c, dist_inputs)) * rng.standard_normal(x.shape)
                out[:, c.action:c.action + c.width] = (
                    squash(c, draw) if c.kind == "squashed_gaussian" else np.clip(draw, c.low, c.high))
        return out

    def greedy(self, dist_inputs: np.ndarray) -> np.ndarray:
        """float32 [N, action_size]: argmax, logit > 0, or the clipped (squashed) mean."""
        out = np.empty((len(dist_inputs), self.action_size), np.float32)
        for c in self.comps:
            x = self._cols(c, dist_inputs)
            if c.kind == "categorical":
                out[:, c.action] = np.argmax(x, axis=1)
            elif c.kind == "bernoulli":
                out[:, c.action:c.action + c.width] = x > 0.0
            else:
                out[:, c.action:c.action + c.width] = (
                    squash(c, x) if c.kind == "squashed_gaussian" else np.clip(x, c.low, c.high))
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
            elif c.kind == "gaussian":
                log_std = self._log_std(c, dist_inputs)
                total += _gaussian_logp((a[:, c.action:c.action + c.width] - x) / np.exp(log_std), log_std)
            else:  # squashed: the density of u, less log |da/du|
                log_std, u = self._log_std(c, dist_inputs), unsquash(c, a[:, c.action:c.action + c.width])
                total += _gaussian_logp((u - x) / np.exp(log_std), log_std) - squash_log_det(c, u)
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
            else:  # (squashed: the entropy of u before the tanh; after it there is no closed form)
                total += (self._log_std(c, dist_inputs) + 0.5 * (1.0 + LOG_2PI)).sum(axis=1)
        return total.astype(np.float32)


def _sample_categorical(logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Inverse-CDF draw per row; a zero-probability (masked) index is never returned."""
    p = np.exp(_log_softmax(logits))                      # [N, n]
    cdf = np.cumsum(p, axis=1)
    u = rng.random((len(p), 1)) * cdf[:, -1:]
    idx = (cdf <= u).sum(axis=1)
    last_positive = p.shape[1] - 1 - np.argmax(p[:, ::-1] > 0.0, axis=1)
    return np.minimum(idx, last_positive)


def categorical_one(logits: list[float], u: float | None) -> tuple[int, float]:
    """One row of ``_sample_categorical`` in plain Python floats (a few logits: ~2 us against
    numpy's ~10 in per-call overhead; a lone agent's every step on either side): the index
    drawn by the inverse CDF at ``u`` in [0, 1) (None: the mode) and its log-probability under
    softmax(logits). A zero-probability (masked) index is never returned."""
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    total = 0.0
    for w in weights:  # (left to right, as the inference role's native step adds them: sum()
        total += w     # compensates its rounding from Python 3.12 on)
    if u is None:
        a = logits.index(top)
    else:
        target, a, acc = u * total, 0, weights[0]
        while acc <= target and a < len(weights) - 1:
            a += 1
            acc += weights[a]
        while weights[a] == 0.0:  # (rounding past the last positive weight)
            a -= 1
    return a, logits[a] - top - math.log(total)
