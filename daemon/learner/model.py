"""Torch twin of `client_lib.protocol.policy_spec.PolicySpec`: the actor-critic the learner trains.

Parameter and buffer names equal `PolicySpec.param_layout()` names, so `flat_weights()` /
`load_flat()` round-trip with the numpy and ONNX forwards of the same spec.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch
from torch import nn

from rlinkd.client_lib.protocol.policy_spec import PolicySpec

_LOG_2PI = math.log(2.0 * math.pi)


def _linears(sizes: tuple[int, ...]) -> nn.ModuleList:
    """Linear layers sizes[0] -> sizes[1] -> ...; named `0`, `1`, ... inside the list."""
    return nn.ModuleList(nn.Linear(n_in, n_out) for n_in, n_out in itertools.pairwise(sizes))


class ActorCritic(nn.Module):
    """MLP actor `pi` and critic `vf` behind a fixed observation normaliser.

    The normaliser (`obs_mean`, `obs_std` buffers) is not trained; the learner copies
    running statistics into it. Initial weights come from `spec.init_flat(init_seed)`.
    """

    obs_mean: torch.Tensor  # registered buffers, declared for the type checker
    obs_std: torch.Tensor

    def __init__(self, spec: PolicySpec, init_seed: int = 0) -> None:
        super().__init__()
        self.spec = spec
        self.register_buffer("obs_mean", torch.zeros(spec.obs_size))
        self.register_buffer("obs_std", torch.ones(spec.obs_size))
        self.pi = _linears((spec.obs_size, *spec.hidden_sizes, spec.action_size))
        if spec.is_box:
            self.log_std = nn.Parameter(torch.zeros(spec.action_size))
        self.vf = _linears((spec.obs_size, *spec.hidden_sizes, 1))
        self._act = torch.tanh if spec.activation == "tanh" else torch.relu
        self.load_flat(spec.init_flat(np.random.default_rng(init_seed)))

    def _mlp(self, layers: nn.ModuleList, obs: torch.Tensor) -> torch.Tensor:
        x = (obs.reshape(-1, self.spec.obs_size) - self.obs_mean) / self.obs_std  # [N, obs]
        for layer in layers[:-1]:
            x = self._act(layer(x))
        return layers[-1](x)

    def dist_inputs(self, obs: torch.Tensor) -> torch.Tensor:
        """[N, dist_size]: logits, or concat(mean, log_std) for box actions."""
        out = self._mlp(self.pi, obs)  # [N, A]
        if self.spec.is_box:
            out = torch.cat([out, self.log_std.expand_as(out)], dim=1)
        return out

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State values [N]."""
        return self._mlp(self.vf, obs)[:, 0]

    def log_prob_entropy(self, obs: torch.Tensor, actions: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """(log pi(a|s) [N], entropy [N]); discrete actions int64 [N], box float [N, A]."""
        out = self._mlp(self.pi, obs)
        if self.spec.is_box:
            log_std = self.log_std.expand_as(out)  # [N, A]
            z = (actions.reshape(out.shape) - out) * torch.exp(-log_std)
            logp = (-0.5 * z.square() - log_std - 0.5 * _LOG_2PI).sum(dim=1)
            return logp, (log_std + 0.5 * (1.0 + _LOG_2PI)).sum(dim=1)
        log_probs = torch.log_softmax(out, dim=1)  # [N, n]
        logp = log_probs.gather(1, actions.reshape(-1, 1).long())[:, 0]
        return logp, -(log_probs.exp() * log_probs).sum(dim=1)

    def _named_tensors(self) -> dict[str, torch.Tensor]:
        return {**dict(self.named_parameters()), **dict(self.named_buffers())}

    @torch.no_grad()
    def flat_weights(self) -> np.ndarray:
        """All weights as one float32 vector in `spec.param_layout()` order (a copy)."""
        tensors = self._named_tensors()
        flat = torch.cat([tensors[name].reshape(-1) for name, _ in self.spec.param_layout()])
        return flat.to(device="cpu", dtype=torch.float32).numpy().copy()

    @torch.no_grad()
    def load_flat(self, flat: np.ndarray) -> None:
        """Overwrite every weight from a layout-ordered vector; ValueError on a wrong size."""
        tensors = self._named_tensors()
        for name, value in self.spec.split_flat(np.asarray(flat, np.float32)).items():
            tensors[name].copy_(torch.from_numpy(np.ascontiguousarray(value)))

    @torch.no_grad()
    def set_obs_normalization(self, mean: np.ndarray, std: np.ndarray) -> None:
        """Copy normaliser statistics [obs_size] into the buffers."""
        self.obs_mean.copy_(torch.as_tensor(mean, dtype=torch.float32))
        self.obs_std.copy_(torch.as_tensor(std, dtype=torch.float32))


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
        delta, total = batch_mean - self.mean, self.count + len(x)
        self.m2 += ((x - batch_mean) ** 2).sum(axis=0) + delta**2 * self.count * len(x) / total
        self.mean += delta * len(x) / total
        self.count = total

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
