"""The DQN learner core: replay rows in, trained weights and stats out (``learner.dqn`` maths).

`DQNLearner` knows nothing of processes or shared memory: the learner process samples the
replay buffer and calls `train_step(rows)` once per gradient step from one thread.
"""
from __future__ import annotations

import copy
from collections.abc import Mapping
import dataclasses
import math
from typing import Any

import numpy as np
import torch

from rlinkd.client_lib.protocol import netops
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.records import obs_columns
from rlinkd.daemon.config import DQNConfig
from rlinkd.daemon.learner.adam import Adam, Descends
from rlinkd.daemon.learner.dqn import (DQN_STATS, double_q_targets, dqn_loss_terms, fan_in_uniform,
                                      linear_schedule)
from rlinkd.daemon.learner.graphed import make_stepper
from rlinkd.daemon.learner.learner import DeviceStats, seeded_model, to_device

DQN_STATE_FORMAT = 1
STEP_STATS = (*DQN_STATS, "grad_norm")
"""A step's statistics, in the order the step returns them."""


class DQNLearner(Descends):
    """Double DQN on `spec`'s network (Q(s, .) is its ``action_dist_inputs``; the critic
    trunk of the spec is unused) with the [dqn] settings `hp`. `env_steps` counts the
    transitions received (the epsilon schedule's clock); the caller advances it."""

    algorithm = "dqn"
    ent_coef = 0.0  # (no entropy term)

    def __init__(self, spec: PolicySpec, hp: DQNConfig, device: str = "auto", seed: int = 0,
                 torch_threads: int = 0, graphs: bool = True) -> None:
        self.spec, self.hp = spec, hp
        self.device, self.model = seeded_model(spec, device, seed, torch_threads)
        if hp.weight_init == "uniform":
            self._uniform_init(seed)
        self.target = copy.deepcopy(self.model).requires_grad_(False)
        self.optimizer = Adam(self.model.parameters(), lr=hp.lr)
        opt = self.optimizer
        self.stepper = make_stepper(self.device, self._sgd_step, [opt.flat, opt.grad, opt.m, opt.v, opt.step_t],
                                    graphs, "dqn")
        self._no_idx = torch.zeros(0, dtype=torch.long, device=self.device)
        self.updates = 0
        self.trained_steps = 0   # transitions sampled, over all updates
        self.env_steps = 0       # transitions received

    def _uniform_init(self, seed: int) -> None:
        """Redraw every linear and convolution layer on the Q path (``dqn.weight_init =
        "uniform"``), from a generator seeded by `seed`: the same weights on any device."""
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for op in self.spec.net.needed((netops.DIST,)):
                if isinstance(op, (netops.Linear, netops.Conv)):
                    weight, bias = self.model.tensor(op.weight), self.model.tensor(op.bias)
                    new_weight, new_bias = fan_in_uniform(tuple(weight.shape), tuple(bias.shape), generator)
                    weight.copy_(new_weight)
                    bias.copy_(new_bias)

    @property
    def lr(self) -> float:
        """The learning rate of the next step (``dqn.lr``, decayed by ``dqn.lr_decay_steps``)."""
        hp = self.hp
        return linear_schedule(self.env_steps, hp.lr, hp.lr_end, hp.lr_decay_steps) if hp.lr_decay_steps else hp.lr

    @property
    def epsilon(self) -> float:
        hp = self.hp
        return linear_schedule(self.env_steps, hp.epsilon_start, hp.epsilon_end, hp.epsilon_decay_steps)

    def train_step(self, rows: np.ndarray) -> Mapping[str, float]:
        """One gradient step on replay rows (``shm.replay`` dtype, [B]); the target network
        follows every ``target_update_interval_updates``. Returns loss, q_mean,
        td_abs_mean, grad_norm, read from the device when first looked at. A non-finite
        loss or gradient skips the step (on the device, without reading it back)."""
        self.optimizer.param_groups[0]["lr"] = self.lr  # (copied into the tensor the step reads)
        run = self.stepper.bind(self._to_tensors(rows), 0)
        info = DeviceStats(STEP_STATS, run(self._no_idx))
        self._count_step(len(rows))
        return info

    def _count_step(self, rows: int) -> None:
        """A step done on `rows` rows: counters, and the target network's copy when due."""
        self.updates += 1
        self.trained_steps += rows
        if self.updates % self.hp.target_update_interval_updates == 0:
            self.target.load_state_dict(self.model.state_dict())  # (in place: a graph still reads it)

    def _to_tensors(self, rows: np.ndarray) -> dict[str, Any]:
        """The step's inputs on the device: observations, actions [B], rewards, discounts."""
        return {"obs": self._obs(rows["obs"]), "next_obs": self._obs(rows["next_obs"]),
                "action": self._tensor(rows["action"][:, 0]),
                "reward": self._tensor(rows["reward"]), "discount": self._tensor(rows["discount"])}

    def _sgd_step(self, data: dict[str, Any], idx: torch.Tensor) -> torch.Tensor:
        """The gradient step on ``data`` (``idx`` unused: the whole sample); its statistics
        [4] (``DQN_STATS``, grad_norm) as a device tensor. Reads nothing back to the host."""
        with torch.no_grad():
            next_target = self.target.dist_inputs(data["next_obs"])          # [B, A]
            next_online = self.model.dist_inputs(data["next_obs"]) if self.hp.double_q else next_target
            targets = double_q_targets(data["reward"], data["discount"], next_online, next_target,
                                       self.hp.double_q)
        loss, stats = dqn_loss_terms(self.model.dist_inputs(data["obs"]), data["action"], targets)
        grad_norm, stats = self._descend(self.optimizer, loss, stats, self.hp.max_grad_norm)
        return torch.cat([stats, grad_norm.reshape(1)])

    def _obs(self, structured: np.ndarray) -> dict[str, torch.Tensor]:
        return {k: self._tensor(v) for k, v in obs_columns(structured, self.spec.obs_space).items()}

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return to_device(array, self.device)

    # ----------------------------------------------------------------- weights and knobs
    def flat_weights(self) -> np.ndarray:
        return self.model.flat_weights()

    def live_hparams(self) -> dict[str, float]:
        return {"lr": self.lr, "epsilon": self.epsilon}

    def set_hparams(self, lr: float | None = None) -> None:
        """A new learning rate from the next step on; ValueError if negative or not finite."""
        if lr is None:
            return
        if not (math.isfinite(lr) and lr >= 0):
            raise ValueError(f"lr must be finite and >= 0, got {lr!r}")
        self.hp = dataclasses.replace(self.hp, lr=float(lr))
        self.optimizer.param_groups[0]["lr"] = float(lr)

    # ----------------------------------------------------------------- checkpointing
    def state_dict(self) -> dict:
        """An exact resume: both networks, optimizer moments, counters (epsilon follows
        from env_steps) and the RNGs."""
        from rlinkd.daemon.learner.learner import _cpu_clone
        return {"format": DQN_STATE_FORMAT, "algorithm": "dqn",
                "model": _cpu_clone(self.model.state_dict()),
                "target": _cpu_clone(self.target.state_dict()),
                "optimizer": _cpu_clone(self.optimizer.state_dict()),
                "updates": self.updates, "trained_steps": self.trained_steps,
                "env_steps": self.env_steps, "torch_rng": torch.get_rng_state()}

    def load_state_dict(self, d: dict) -> dict[str, float]:
        """Restore a `state_dict()`; the saved lr is returned, the config's kept.
        ValueError for another algorithm's or format's state (nothing changed then)."""
        if d.get("algorithm") != "dqn" or d.get("format") != DQN_STATE_FORMAT:
            raise ValueError(f"not a DQN learner state (format {d.get('format')!r}, "
                             f"algorithm {d.get('algorithm')!r})")
        self.model.load_state_dict(d["model"])
        self.target.load_state_dict(d["target"])
        self.optimizer.load_state_dict(d["optimizer"])
        self.optimizer.param_groups[0]["lr"] = float(self.hp.lr)
        self.updates, self.trained_steps = int(d["updates"]), int(d["trained_steps"])
        self.env_steps = int(d["env_steps"])
        torch.set_rng_state(d["torch_rng"])
        return {"lr": float(d["optimizer"]["param_groups"][0]["lr"])}
