"""Adam (Kingma & Ba, 2015) for the learner, with the slice of torch.optim's interface it uses.

Why not ``torch.optim.Adam``: on torch 2.x, constructing any ``torch.optim`` optimizer
imports ``torch._dynamo`` (~800 modules), which costs the learner ~70 MB of RSS and one
to two seconds of start-up — paid at every (re)start, for nothing we use. The update
below is the paper's, done with ``torch._foreach_*`` kernels (one launch per op for
all parameters); ``tests/test_learner_adam.py`` checks it against torch.optim.Adam.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch


class Adam:
    """Adam without weight decay or amsgrad. ``param_groups[0]["lr"]`` may be changed live."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, betas=(0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.param_groups: list[dict[str, Any]] = [{"lr": float(lr), "betas": tuple(betas),
                                                    "eps": float(eps)}]
        self.step_count = 0
        self.exp_avg = [torch.zeros_like(p) for p in self.params]      # m_t
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]   # v_t

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """θ ← θ − lr · m̂ / (√v̂ + ε), with bias-corrected first and second moments."""
        group = self.param_groups[0]
        lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
        live = [i for i, p in enumerate(self.params) if p.grad is not None]
        params = [self.params[i] for i in live]
        grads = [p.grad for p in params if p.grad is not None]  # all of them, by `live`
        m = [self.exp_avg[i] for i in live]
        v = [self.exp_avg_sq[i] for i in live]
        self.step_count += 1
        torch._foreach_lerp_(m, grads, 1 - beta1)                     # m = β1·m + (1−β1)·g
        torch._foreach_mul_(v, beta2)
        torch._foreach_addcmul_(v, grads, grads, value=1 - beta2)      # v = β2·v + (1−β2)·g²
        bias1 = 1 - beta1 ** self.step_count
        bias2 = 1 - beta2 ** self.step_count
        denom = torch._foreach_sqrt(v)
        torch._foreach_div_(denom, math.sqrt(bias2))
        torch._foreach_add_(denom, eps)                                # √v̂ + ε
        torch._foreach_addcdiv_(params, m, denom, value=-lr / bias1)   # θ −= lr·m̂/(√v̂+ε)

    def state_dict(self) -> dict:
        """Tensors and plain values only (loadable with ``torch.load(weights_only=True)``)."""
        return {"step": self.step_count, "param_groups": [dict(self.param_groups[0])],
                "exp_avg": list(self.exp_avg), "exp_avg_sq": list(self.exp_avg_sq)}

    def load_state_dict(self, state: dict) -> None:
        if len(state["exp_avg"]) != len(self.params):
            raise ValueError("optimizer state does not match the model's parameters")
        self.step_count = int(state["step"])
        group = state["param_groups"][0]
        self.param_groups[0].update(lr=float(group["lr"]), betas=tuple(group["betas"]),
                                    eps=float(group["eps"]))
        for mine, saved in zip(self.exp_avg + self.exp_avg_sq, state["exp_avg"] + state["exp_avg_sq"]):
            mine.copy_(saved)
