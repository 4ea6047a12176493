"""Torch twin of `client_lib.protocol.policy_spec.PolicySpec`: the actor-critic the learner trains.

`ActorCritic(spec)` interprets the spec's op list (`spec.ops()`, see `netops`) with torch —
the same description the numpy and ONNX forwards run — and `TorchActionDist` is the torch
twin of `client_lib.protocol.distributions.ActionDist` over the same components.

Parameters are registered under the layout names with "." replaced by ":" (torch forbids
dots; ":" never occurs in a layout name, so the mapping `torch_names` is one-to-one). The
normalisers' statistics are buffers (not trained); everything else is an nn.Parameter,
registered in layout order. `flat_weights()` / `load_flat()` round-trip `param_layout()`.
A recurrent spec's cell (`learner.recurrent`) runs one step in `run(..., state)` and over
[T, B] chunks with episode resets in `run_sequence`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from rlinkd.client_lib.protocol import netops as N
from rlinkd.client_lib.protocol.distributions import SQUASH_EDGE, Component
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.daemon.learner import recurrent as R

_LOG_2PI = math.log(2.0 * math.pi)
Obs = Mapping[str, torch.Tensor] | torch.Tensor
Env = dict[str, torch.Tensor]


def torch_name(layout_name: str) -> str:
    """The registered torch name of a layout parameter."""
    return layout_name.replace(".", ":")


def onehot_names(op: N.OneHot) -> tuple[str, str]:
    """The names of a one-hot op's columns and values among the network's tensors."""
    return f"{torch_name(op.out)}#columns", f"{torch_name(op.out)}#values"


def _apply(op: N.Op, env: Env, p: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """One torch implementation per op (the numpy and ONNX ones are in client_lib)."""
    if isinstance(op, N.Cast):
        return env[op.x].float()
    if isinstance(op, N.Scale):
        return env[op.x] * op.factor
    if isinstance(op, N.Normalize):
        return (env[op.x] - p[op.mean]) / p[op.std]
    if isinstance(op, N.OneHot):  # (columns and values: the network's buffers, see onehot_names)
        columns, values = (p[name] for name in onehot_names(op))
        return (env[op.x][:, columns] == values).float()
    if isinstance(op, N.Flatten):
        return env[op.x].reshape(env[op.x].shape[0], -1)
    if isinstance(op, N.ToNCHW):
        return env[op.x].permute(0, 3, 1, 2)
    if isinstance(op, N.Conv):
        return F.conv2d(env[op.x], p[op.weight], p[op.bias], stride=op.stride)
    if isinstance(op, N.Linear):
        return F.linear(env[op.x], p[op.weight], p[op.bias])
    if isinstance(op, N.Act):
        return torch.tanh(env[op.x]) if op.kind == "tanh" else torch.relu(env[op.x])
    if isinstance(op, N.Concat):
        return torch.cat([env[x] for x in op.xs], dim=1)
    if isinstance(op, N.Slice):
        return env[op.x][:, op.start:op.stop]
    if isinstance(op, N.Tile):
        return p[op.param].expand(env[op.x].shape[0], -1)
    if isinstance(op, N.Clip):
        return torch.clamp(env[op.x], op.low, op.high)
    if isinstance(op, N.Mask):  # where, not an addition: no gradient reaches a masked logit
        legal = env[op.mask][:, op.start:op.stop] != 0
        return torch.where(legal, env[op.x], torch.full_like(env[op.x], N.MASKED_LOGIT))
    if isinstance(op, N.Recurrent):
        weights = (p[op.weight_ih], p[op.weight_hh], p[op.bias_ih], p[op.bias_hh])
        return R.STEPS[op.cell](env[op.x], env[op.state], weights)
    raise TypeError(f"no torch implementation of {type(op).__name__}")


def _leaf(obs: Mapping[str, torch.Tensor], op: N.Input) -> torch.Tensor:
    """Observation leaf `op.key` as [N, *op.shape] (float leaves may come flattened)."""
    x = obs[op.key]
    return x.reshape(x.shape[0], *op.shape) if x.dim() != 1 + len(op.shape) else x


def _gaussian_logp(z: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    return (-0.5 * z.square() - log_std - 0.5 * _LOG_2PI).sum(dim=1)


class Squash(nn.Module):
    """A squashed Gaussian component's map u -> a = low + (tanh(u) + 1) / 2 * (high - low),
    torch side (the numpy one is `distributions.squash`; a test keeps them equal). Its
    constants are non-persistent buffers: they move with the network once (``.to``), so a
    step copies nothing to the device and can be captured in a CUDA graph."""

    low: torch.Tensor
    half_range: torch.Tensor
    log_half: torch.Tensor

    def __init__(self, c: Component) -> None:
        super().__init__()
        half_range = torch.tensor([(h - lo) / 2 for lo, h in zip(c.low, c.high)], dtype=torch.float32)
        self.register_buffer("low", torch.tensor(c.low, dtype=torch.float32), persistent=False)
        self.register_buffer("half_range", half_range, persistent=False)
        self.register_buffer("log_half", torch.log(half_range), persistent=False)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return self.low + (torch.tanh(u) + 1.0) * self.half_range

    def inverse(self, a: torch.Tensor) -> torch.Tensor:
        t = (a - self.low) / self.half_range - 1.0
        return torch.atanh(t.clamp(-SQUASH_EDGE, SQUASH_EDGE))

    def log_det(self, u: torch.Tensor) -> torch.Tensor:
        """log |da/du| [N]: log(half range) + log(1 - tanh(u)^2), the latter computed as
        2 * (log 2 - u - softplus(-2u)) (stable for large |u|)."""
        return (self.log_half + 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(dim=1)


class TorchActionDist(nn.Module):
    """log-prob and entropy of the product distribution, torch (autograd) side (a module
    only to carry the squashes' constants along with the network)."""

    def __init__(self, comps: tuple[Component, ...], action_size: int) -> None:
        super().__init__()
        self.comps, self.action_size = comps, action_size
        squashes = {c.dist: Squash(c) for c in comps if c.kind == "squashed_gaussian"}
        self.squashes = nn.ModuleList(squashes.values())  # (registered: moved by .to)
        self.squash = squashes

    def rsample(self, dist: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised draw of an all-squashed-Gaussian action (SAC): (actions [N, A],
        log pi(a|s) [N]) with u = mean + std * noise (noise [N, A] standard normal), gradients
        flowing into `dist`. ValueError for any other component kind."""
        actions, logp = [], dist.new_zeros(dist.shape[0])
        for c in self.comps:
            if c.kind != "squashed_gaussian":
                raise ValueError(f"rsample needs squashed Gaussian actions, not {c.kind}")
            mean, log_std = dist[:, c.dist:c.dist + c.width], dist[:, c.dist + c.width:c.dist + 2 * c.width]
            eps = noise[:, c.action:c.action + c.width]
            u = mean + log_std.exp() * eps                                      # [N, d]
            actions.append(self.squash[c.dist](u))
            logp = logp + _gaussian_logp(eps, log_std) - self.squash[c.dist].log_det(u)
        return torch.cat(actions, dim=1), logp

    def log_prob_entropy(self, dist: torch.Tensor, actions: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """(log pi(a|s) [N], entropy [N]) from dist inputs [N, D], actions [N, A] (indices)."""
        a = actions.reshape(dist.shape[0], self.action_size).to(dist.dtype)
        logp = dist.new_zeros(dist.shape[0])
        ent = dist.new_zeros(dist.shape[0])
        for c in self.comps:
            x = dist[:, c.dist:c.dist + c.width]
            if c.kind == "categorical":
                log_probs = torch.log_softmax(x, dim=1)
                idx = a[:, c.action:c.action + 1].round().long()
                logp = logp + log_probs.gather(1, idx)[:, 0]
                ent = ent - (log_probs.exp() * log_probs).sum(dim=1)
            elif c.kind == "bernoulli":
                bits = a[:, c.action:c.action + c.width]
                logp = logp + (bits * x - F.softplus(x)).sum(dim=1)
                ent = ent + (F.softplus(x) - x * torch.sigmoid(x)).sum(dim=1)
            else:
                log_std = dist[:, c.dist + c.width:c.dist + 2 * c.width]
                taken = a[:, c.action:c.action + c.width]
                if c.kind == "squashed_gaussian":
                    u = self.squash[c.dist].inverse(taken)
                    logp = logp + _gaussian_logp((u - x) * torch.exp(-log_std), log_std) \
                        - self.squash[c.dist].log_det(u)
                else:
                    logp = logp + _gaussian_logp((taken - x) * torch.exp(-log_std), log_std)
                ent = ent + (log_std + 0.5 * (1.0 + _LOG_2PI)).sum(dim=1)
        return logp, ent


class ActorCritic(nn.Module):
    """The spec's network in torch. Observations: leaf key -> tensor [N, *record_shape] in
    the record dtype (a bare tensor for a root leaf; float leaves may come flattened).
    Initial weights come from `spec.init_flat(init_seed)`; the normalisers' buffers are
    the identity until the learner copies running statistics in."""

    def __init__(self, spec: PolicySpec, init_seed: int = 0) -> None:
        super().__init__()
        self.spec = spec
        self.torch_names = {p.name: torch_name(p.name) for p in spec.net.params}
        for p in spec.net.params:
            zeros = torch.zeros(p.shape)
            if p.trainable:
                self.register_parameter(self.torch_names[p.name], nn.Parameter(zeros))
            else:
                self.register_buffer(self.torch_names[p.name], zeros)
        for op in spec.net.ops:  # constants as buffers: a step copies nothing to the device
            if isinstance(op, N.OneHot):
                for name, values in zip(onehot_names(op), (op.columns, op.values)):
                    self.register_buffer(name, torch.tensor(values, dtype=torch.long), persistent=False)
        self._plans: dict[tuple[str, ...], tuple[N.Op, ...]] = {
            outs: spec.net.needed(outs) for outs in ((N.DIST,), (N.VALUE,), (N.DIST, N.VALUE))}
        if spec.net.state_width:
            self._plans.update({outs: spec.net.needed(outs) for outs in (
                (N.DIST, N.STATE_OUT), (N.VALUE, N.STATE_OUT), (N.DIST, N.VALUE, N.STATE_OUT))})
        self.dist = TorchActionDist(spec.action_components, spec.action_size)
        self.load_flat(spec.init_flat(np.random.default_rng(init_seed)))

    def _layout_tensors(self) -> dict[str, torch.Tensor]:
        """Layout name -> registered tensor, cached: looked up once per forward, and walking
        the module tree each time costs a SAC update ~10 %. `_apply` (to(), cuda(), ...)
        drops the cache, as it may replace the tensors."""
        cached = self.__dict__.get("_tensor_cache")
        if cached is None:
            tensors = {**dict(self.named_parameters()), **dict(self.named_buffers())}
            cached = {name: tensors[tn] for name, tn in self.torch_names.items()}
            cached.update((name, t) for name, t in tensors.items() if "#" in name)
            self.__dict__["_tensor_cache"] = cached
        return cached

    def _apply(self, fn, recurse=True):
        self.__dict__.pop("_tensor_cache", None)
        return super()._apply(fn, recurse)

    def tensor(self, name: str) -> torch.Tensor:
        """The parameter or buffer of layout name `name` (KeyError if none)."""
        return self._layout_tensors()[name]

    def run(self, obs: Obs, outputs: tuple[str, ...], state: torch.Tensor | None = None
            ) -> list[torch.Tensor]:
        """The op list for `outputs` ((DIST,), (VALUE,) or (DIST, VALUE); a recurrent network
        also accepts them with STATE_OUT last) for one step; KeyError on a missing
        observation leaf. A recurrent network reads `state` [N, S] (ValueError if None)."""
        if not isinstance(obs, Mapping):
            obs = {"": obs}
        params, env = self._layout_tensors(), {}
        for op in self._plans[outputs]:
            if isinstance(op, N.Input):
                env[op.out] = _leaf(obs, op)
            elif isinstance(op, N.State):
                if state is None:
                    raise ValueError(f"this network is recurrent: run needs a state [N, {op.width}]")
                env[op.out] = state
            else:
                env[op.out] = _apply(op, env, params)
        return [env[name] for name in outputs]

    def run_sequence(self, obs: Obs, state0: torch.Tensor, starts: torch.Tensor,
                     outputs: tuple[str, ...]) -> list[torch.Tensor]:
        """A recurrent network over chunks: obs leaves [T, B, *shape], state0 [B, S] (the
        state before step 0), starts [T, B] (1 where an episode begins: state zeroed first)
        -> `outputs` as [T, B, *] (STATE_OUT: the state after each step). The encoders and
        trunks run on all T*B rows at once, only the cell steps through time."""
        if not isinstance(obs, Mapping):
            obs = {"": obs}
        t, b = starts.shape
        flat = {k: v.reshape(t * b, *v.shape[2:]) for k, v in obs.items()}
        params, env = self._layout_tensors(), {}
        for op in self._plans[outputs]:
            if isinstance(op, N.Input):
                env[op.out] = _leaf(flat, op)
            elif isinstance(op, N.Recurrent):
                weights = (params[op.weight_ih], params[op.weight_hh], params[op.bias_ih],
                           params[op.bias_hh])
                x = env[op.x].reshape(t, b, -1)
                env[op.out] = R.sequence(op.cell, x, state0, starts, weights).reshape(t * b, -1)
            elif not isinstance(op, N.State):
                env[op.out] = _apply(op, env, params)
        return [env[name].reshape(t, b, *env[name].shape[1:]) for name in outputs]

    def dist_inputs(self, obs: Obs) -> torch.Tensor:
        """[N, dist_size] in the `action_dist_inputs` layout."""
        return self.run(obs, (N.DIST,))[0]

    def value(self, obs: Obs) -> torch.Tensor:
        """State values [N]."""
        return self.run(obs, (N.VALUE,))[0][:, 0]

    def log_prob_entropy(self, obs: Obs, actions: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """(log pi(a|s) [N], entropy [N]); actions [N, action_size] indices/floats."""
        return self.dist.log_prob_entropy(self.dist_inputs(obs), actions)

    def evaluate(self, obs: Obs, actions: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log-prob [N], entropy [N], value [N]) in one pass (shared encoders run once)."""
        dist, value = self.run(obs, (N.DIST, N.VALUE))
        logp, ent = self.dist.log_prob_entropy(dist, actions)
        return logp, ent, value[:, 0]

    @torch.no_grad()
    def flat_weights(self) -> np.ndarray:
        """All weights as one float32 vector in `spec.param_layout()` order (a copy)."""
        tensors = self._layout_tensors()
        flat = torch.cat([tensors[name].reshape(-1) for name, _ in self.spec.param_layout()])
        return flat.to(device="cpu", dtype=torch.float32).numpy().copy()

    @torch.no_grad()
    def load_flat(self, flat: np.ndarray) -> None:
        """Overwrite every weight from a layout-ordered vector; ValueError on a wrong size."""
        tensors = self._layout_tensors()
        for name, value in self.spec.split_flat(np.asarray(flat, np.float32)).items():
            tensors[name].copy_(torch.from_numpy(np.ascontiguousarray(value)))

    @torch.no_grad()
    def set_normalizer(self, key: str, mean: np.ndarray, std: np.ndarray) -> None:
        """Copy running statistics of observation leaf `key` into its normaliser buffers
        (shapes as `spec.normalizers()` says); KeyError for a leaf without a normaliser."""
        entry = {n.key: n for n in self.spec.normalizers()}[key]
        tensors = self._layout_tensors()
        for name, value in ((entry.mean, mean), (entry.std, std)):
            target = tensors[name]
            target.copy_(torch.as_tensor(value, dtype=torch.float32).reshape(target.shape))

    def normalizer_stats(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std) in leaf `key`'s normaliser buffers, float64 flat; KeyError as above."""
        entry = {n.key: n for n in self.spec.normalizers()}[key]
        tensors = self._layout_tensors()
        return tuple(tensors[name].detach().cpu().double().numpy().reshape(-1)  # type: ignore[return-value]
                     for name in (entry.mean, entry.std))

    def set_obs_normalization(self, mean: np.ndarray, std: np.ndarray) -> None:
        """`set_normalizer` for a root observation leaf (the MLP-era spelling)."""
        self.set_normalizer("", mean, std)


class ObsNormalizer:
    """Running per-feature mean and variance of observations (float64), merged batch by batch
    with Chan et al.'s parallel Welford update. Before any data it is the identity (0 / 1).

    `std = sqrt(var + eps)`: a feature that has been constant so far gets std ~ sqrt(eps), so
    a later change of that feature is amplified strongly (there is no clipping).
    """

    def __init__(self, size: int, eps: float = 1e-8) -> None:
        self.size, self.eps = size, eps
        self.count = 0
        self.mean = np.zeros(size, np.float64)
        self.m2 = np.zeros(size, np.float64)  # sum of squared deviations from the mean

    def update(self, obs: np.ndarray) -> None:
        """Fold a batch [N, size] into the statistics; ValueError on non-finite values."""
        x = np.asarray(obs, np.float64).reshape(-1, self.size)
        if not np.isfinite(x).all():
            raise ValueError("observations contain NaN or inf; normaliser not updated")
        if len(x) == 0:
            return
        batch_mean = x.mean(axis=0)
        self.fold(len(x), batch_mean, ((x - batch_mean) ** 2).sum(axis=0))

    def fold(self, n: int, batch_mean: np.ndarray | torch.Tensor,
             batch_m2: np.ndarray | torch.Tensor) -> None:
        """Fold a batch known by its moments: `n` rows, their mean [size] and sum of squared
        deviations from it [size] (a job merges its ranks' batches this way); n = 0: no-op."""
        if n == 0:
            return
        batch_mean, batch_m2 = np.asarray(batch_mean, np.float64), np.asarray(batch_m2, np.float64)
        delta, total = batch_mean - self.mean, self.count + n
        self.m2 += batch_m2 + delta**2 * self.count * n / total
        self.mean += delta * n / total
        self.count = total

    def rebase(self, mean: np.ndarray, std: np.ndarray) -> None:
        """Take another learner's published statistics (mean, std = sqrt(var + eps)) as this
        normaliser's, keeping its count (the weight they carry against later batches)."""
        self.mean = np.asarray(mean, np.float64).reshape(self.size).copy()
        var = np.maximum(np.asarray(std, np.float64).reshape(self.size) ** 2 - self.eps, 0.0)
        self.m2 = var * self.count

    @property
    def var(self) -> np.ndarray:
        return self.m2 / self.count if self.count else np.ones(self.size)

    @property
    def std(self) -> np.ndarray:
        if not self.count:
            return np.ones(self.size)
        return np.sqrt(self.var + self.eps)

    def state_dict(self) -> dict:
        return {"count": self.count, "mean": torch.from_numpy(self.mean.copy()),
                "m2": torch.from_numpy(self.m2.copy()), "eps": self.eps}

    def load_state_dict(self, d: dict) -> None:
        self.count, self.eps = int(d["count"]), float(d["eps"])
        self.mean = d["mean"].numpy().astype(np.float64).copy()
        self.m2 = d["m2"].numpy().astype(np.float64).copy()
