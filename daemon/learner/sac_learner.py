"""The SAC learner core: replay rows in, trained actor weights and stats out (``learner.sac``
maths).

The actor is the spec's network (its ``action_dist_inputs`` are the means and clipped
log-stds of a tanh-squashed Gaussian; its critic trunk is unused). Each critic Q_i(s, a) is
the value output of `critic_spec(spec)`: the same netops description over the observation
leaves under "obs" plus the action as a Box leaf "action" — so a critic's encoders and
trunk are built, initialised and run exactly as the actor's are. `SACLearner` knows nothing
of processes or shared memory: the learner process samples the replay buffer and calls
`train_step(rows)` once per gradient step from one thread.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.records import obs_columns
from rlinkd.client_lib.protocol.spaces import Box, Dict
from rlinkd.daemon.config import SACConfig
from rlinkd.daemon.learner.adam import Adam, Descends
from rlinkd.daemon.learner.graphed import make_stepper
from rlinkd.daemon.learner.learner import DeviceStats, _cpu_clone, seeded_model, to_device
from rlinkd.daemon.learner.model import ActorCritic
from rlinkd.daemon.learner.sac import (ACTOR_STATS, CRITIC_STATS, actor_loss_terms, alpha_loss,
                                       critic_loss_terms, polyak_update, soft_q_targets)

SAC_STATE_FORMAT = 1
SAC_STATS = ("loss", *CRITIC_STATS, "grad_norm", *ACTOR_STATS, "alpha")
"""A step's statistics, in the order the step returns them."""
OBS_KEY, ACTION_KEY = "obs", "action"


def step_stats(critic_stats: torch.Tensor, grad_norm: torch.Tensor, actor_stats: torch.Tensor,
               alpha: torch.Tensor) -> torch.Tensor:
    """A step's statistics [len(SAC_STATS)] from its parts (the critics' loss leads as "loss")."""
    return torch.cat([critic_stats[:1], critic_stats, grad_norm.reshape(1), actor_stats,
                      alpha.reshape(1)])


def critic_spec(spec: PolicySpec) -> PolicySpec:
    """The network whose value output is Q(s, a): observation space Dict(obs = the policy's
    observation space, action = Box of the action vector), the policy's trunk sizes and
    convolution settings, no action mask (a mask leaf is just a feature here)."""
    low = [lo for c in spec.action_components for lo in c.low]
    high = [hi for c in spec.action_components for hi in c.high]
    action = Box((spec.action_size,), low=low, high=high)
    space = Dict(((OBS_KEY, spec.obs_space), (ACTION_KEY, action)))
    return dataclasses.replace(spec, obs_space=space, action_mask_key="", box_dist="gaussian")


def critic_key(obs_key: str) -> str:
    """An observation leaf's key inside the critic's observation space."""
    return f"{OBS_KEY}.{obs_key}" if obs_key else OBS_KEY


class SACLearner(Descends):
    """SAC on `spec` (all actions squashed Gaussian) with the [sac] settings `hp`.
    `env_steps` counts the transitions received; the caller advances it."""

    algorithm = "sac"

    def __init__(self, spec: PolicySpec, hp: SACConfig, device: str = "auto", seed: int = 0,
                 torch_threads: int = 0, graphs: bool = True) -> None:
        self.spec, self.hp = spec, hp
        self.device, self.model = seeded_model(spec, device, seed, torch_threads)   # the actor
        cspec = critic_spec(spec)
        self.critics = [ActorCritic(cspec, init_seed=seed + i).to(self.device) for i in (1, 2)]
        self.targets = [copy.deepcopy(c).requires_grad_(False) for c in self.critics]
        self._polyak_pairs = (_tensors(self.targets), _tensors(self.critics))  # (updated in place)
        self.log_alpha = torch.tensor(math.log(max(hp.initial_alpha, 1e-12)), device=self.device,
                                      requires_grad=hp.autotune_alpha)
        self.target_entropy = hp.target_entropy_per_dim * spec.action_size
        # log pi is taken on actions rescaled to [-1, 1] (tanh(u)), as in the paper and SB3, so
        # the entropy target does not depend on the bounds: + sum log((high - low) / 2)
        self.log_scale = sum(math.log((hi - lo) / 2) for c in spec.action_components
                             for lo, hi in zip(c.low, c.high))
        self.actor_opt = Adam(self.model.parameters(), lr=hp.lr)
        self.critic_opt = Adam(self._critic_params(), lr=hp.lr)
        self.alpha_opt = Adam([self.log_alpha], lr=hp.lr) if hp.autotune_alpha else None
        self.noise = torch.Generator(device=self.device).manual_seed(seed)  # the actor's draws
        self.stepper = make_stepper(self.device, self._sgd_step, self._step_state(), graphs, "sac")
        self._no_idx = torch.zeros(0, dtype=torch.long, device=self.device)
        self.updates = 0
        self.trained_steps = 0   # transitions sampled, over all updates
        self.env_steps = 0       # transitions received

    def _step_state(self) -> list[torch.Tensor]:
        """The tensors a step changes (saved and restored around a capture)."""
        return [t for o in self._optimizers() for t in (o.flat, o.grad, o.m, o.v, o.step_t)] \
            + self._polyak_pairs[0]

    def _critic_params(self) -> list[torch.Tensor]:
        return [p for c in self.critics for p in c.parameters()]

    @property
    def alpha(self) -> float:
        return float(self.log_alpha.detach().exp())

    @property
    def ent_coef(self) -> float:
        """The entropy coefficient alpha (reported as the learner's ent_coef)."""
        return self.alpha

    @property
    def epsilon(self) -> None:
        """SAC clients explore by sampling the actor: no epsilon is announced."""
        return None

    # ----------------------------------------------------------------- one gradient step
    def train_step(self, rows: np.ndarray) -> Mapping[str, float]:
        """One critic, actor (and alpha) step on replay rows (``shm.replay`` dtype, [B]),
        then the Polyak update of the target critics. Returns ``SAC_STATS`` (loss is the
        critics'; grad_norm the critics' before clipping), read from the device when first
        looked at. A step whose loss or gradient is not finite is skipped on the device, per
        network, without reading it back (the update is still counted)."""
        run = self.stepper.bind(self._to_tensors(rows), 0)
        stats = DeviceStats(SAC_STATS, run(self._no_idx))
        self._count_step(len(rows))
        return stats

    def _count_step(self, rows: int) -> None:
        self.updates += 1
        self.trained_steps += rows

    def _to_tensors(self, rows: np.ndarray) -> dict[str, Any]:
        """The step's inputs on the device, with the actor's two noise draws [B, A] (drawn
        here, outside the step, so that a captured step replays with fresh noise)."""
        n, size = len(rows), self.spec.action_size
        next_noise, noise = (torch.randn(n, size, device=self.device, generator=self.noise) for _ in "ab")
        return {"obs": self._obs(rows["obs"]), "next_obs": self._obs(rows["next_obs"]),
                "action": self._tensor(rows["action"]), "reward": self._tensor(rows["reward"]),
                "discount": self._tensor(rows["discount"]), "next_noise": next_noise, "noise": noise}

    def _sgd_step(self, data: dict[str, Any], idx: torch.Tensor) -> torch.Tensor:
        """The gradient step on ``data`` (``idx`` unused: the whole sample); its statistics
        [len(SAC_STATS)] as a device tensor. Reads nothing back to the host."""
        obs, alpha = data["obs"], self.log_alpha.detach().exp()
        with torch.no_grad():
            next_actions, next_logp = self._sample(data["next_obs"], data["next_noise"])  # [B, A], [B]
            next_q = [t.value(self._q_input(data["next_obs"], next_actions)) for t in self.targets]
            targets = soft_q_targets(data["reward"], data["discount"], next_q[0], next_q[1], next_logp, alpha)
        q = [c.value(self._q_input(obs, data["action"])) for c in self.critics]   # 2 x [B]
        loss_q, critic_stats = critic_loss_terms(q[0], q[1], targets)
        grad_norm, critic_stats = self._step(self.critic_opt, loss_q, critic_stats)
        pi_actions, logp_pi = self._sample(obs, data["noise"])                   # with gradients
        with _frozen(self.critics):  # (the actor's gradient passes through them; theirs is not needed)
            q_pi = [c.value(self._q_input(obs, pi_actions)) for c in self.critics]
            loss_pi, actor_stats = actor_loss_terms(q_pi[0], q_pi[1], logp_pi, alpha)
            _, actor_stats = self._step(self.actor_opt, loss_pi, actor_stats)
        if self.alpha_opt is not None:
            self._step(self.alpha_opt, alpha_loss(self.log_alpha, logp_pi, self.target_entropy))
        polyak_update(*self._polyak_pairs, self.hp.tau)
        return step_stats(critic_stats, grad_norm, actor_stats, alpha)

    def _step(self, optimizer: Adam, loss: torch.Tensor | None,
              stats: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One network's step with the optional clip (``_descend``); (its gradient norm before
        clipping, ``stats``: empty when None)."""
        stats = torch.zeros(0, device=self.device) if stats is None else stats
        return self._descend(optimizer, loss, stats,
                             self.hp.max_grad_norm if self.hp.max_grad_norm > 0 else None)

    def _sample(self, obs: dict[str, torch.Tensor], noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised actions [B, A] (in the bounds) from standard normal ``noise``
        [B, A], and log pi [B] of them measured on the [-1, 1] scale (a constant shift of
        the density in action units)."""
        actions, logp = self.model.dist.rsample(self.model.dist_inputs(obs), noise)
        return actions, logp + self.log_scale

    def _q_input(self, obs: dict[str, torch.Tensor], actions: torch.Tensor) -> dict[str, torch.Tensor]:
        return {**{critic_key(k): v for k, v in obs.items()}, ACTION_KEY: actions}

    def _obs(self, structured: np.ndarray) -> dict[str, torch.Tensor]:
        return {k: self._tensor(v) for k, v in obs_columns(structured, self.spec.obs_space).items()}

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return to_device(array, self.device)

    # ----------------------------------------------------------------- weights and knobs
    def flat_weights(self) -> np.ndarray:
        return self.model.flat_weights()

    def set_hparams(self, lr: float | None = None) -> None:
        """A new learning rate (all three optimizers) from the next step on; ValueError if
        negative or not finite."""
        if lr is None:
            return
        if not (math.isfinite(lr) and lr >= 0):
            raise ValueError(f"lr must be finite and >= 0, got {lr!r}")
        self.hp = dataclasses.replace(self.hp, lr=float(lr))
        for optimizer in self._optimizers():
            optimizer.param_groups[0]["lr"] = float(lr)

    def _optimizers(self) -> list[Adam]:
        return [o for o in (self.actor_opt, self.critic_opt, self.alpha_opt) if o is not None]

    # ----------------------------------------------------------------- checkpointing
    def state_dict(self) -> dict:
        """An exact resume: actor, critics, target critics, log alpha, every optimizer's
        moments, the counters and the actor's noise generator."""
        return {"format": SAC_STATE_FORMAT, "algorithm": "sac",
                "model": _cpu_clone(self.model.state_dict()),
                "critics": [_cpu_clone(c.state_dict()) for c in self.critics],
                "targets": [_cpu_clone(t.state_dict()) for t in self.targets],
                "log_alpha": _cpu_clone(self.log_alpha),
                "optimizers": [_cpu_clone(o.state_dict()) for o in self._optimizers()],
                "updates": self.updates, "trained_steps": self.trained_steps,
                "env_steps": self.env_steps, "noise_rng": self.noise.get_state()}

    def load_state_dict(self, d: dict) -> dict[str, float]:
        """Restore a `state_dict()`; the saved lr is returned, the config's kept. ValueError
        for another algorithm's or format's state, or a different alpha tuning setting."""
        if d.get("algorithm") != "sac" or d.get("format") != SAC_STATE_FORMAT:
            raise ValueError(f"not a SAC learner state (format {d.get('format')!r}, "
                             f"algorithm {d.get('algorithm')!r})")
        if len(d["optimizers"]) != len(self._optimizers()):
            raise ValueError("the checkpoint's sac.autotune_alpha differs from the config's")
        self.model.load_state_dict(d["model"])
        for mine, saved in zip(self.critics + self.targets, d["critics"] + d["targets"]):
            mine.load_state_dict(saved)
        with torch.no_grad():  # (a fixed alpha is the config's, like lr)
            self.log_alpha.copy_(d["log_alpha"] if self.hp.autotune_alpha
                                 else torch.tensor(math.log(max(self.hp.initial_alpha, 1e-12))))
        for optimizer, saved in zip(self._optimizers(), d["optimizers"]):
            optimizer.load_state_dict(saved)
            optimizer.param_groups[0]["lr"] = float(self.hp.lr)
        self.updates, self.trained_steps = int(d["updates"]), int(d["trained_steps"])
        self.env_steps = int(d["env_steps"])
        self._restore_noise(d["noise_rng"])
        return {"lr": float(d["optimizers"][0]["param_groups"][0]["lr"])}

    def _restore_noise(self, state: torch.Tensor) -> None:
        """The actor's noise generator as saved; a state saved on another kind of device (a
        CUDA generator's state does not fit a CPU one) seeds this generator from its bytes:
        the draws go on differently, deterministically."""
        if state.numel() == self.noise.get_state().numel():
            self.noise.set_state(state)
        else:
            digest = hashlib.sha256(state.numpy().tobytes()).digest()
            self.noise.manual_seed(int.from_bytes(digest[:8], "little"))


@contextmanager
def _frozen(modules: list[ActorCritic]) -> Iterator[None]:
    """Gradients off for ``modules`` inside, on again after (also when the step inside
    raises, as a failed graph capture does)."""
    for module in modules:
        module.requires_grad_(False)
    try:
        yield
    finally:
        for module in modules:
            module.requires_grad_(True)


def _tensors(modules: Iterable[torch.nn.Module]) -> list[torch.Tensor]:
    return [t for m in modules for t in m.state_dict(keep_vars=True).values()]
