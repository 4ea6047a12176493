"""Adam (Kingma & Ba, 2015) for the learner, with the slice of torch.optim's interface it uses.

Why not ``torch.optim.Adam``: on torch 2.x, constructing any ``torch.optim`` optimizer
imports ``torch._dynamo`` (~800 modules), which costs the learner ~70 MB of RSS and one
to two seconds of start-up — paid at every (re)start, for nothing we use.

Flat buffers: at construction the parameters are moved into one contiguous buffer (each
parameter's ``.data`` becomes a view of it), and so are their gradients (``.grad`` views
that backward accumulates into) and both moments. A step is then a dozen single-tensor
operations whatever the number of layers: few kernel launches on a GPU, few dispatches on
a CPU. The learning rate and the step count live on the device (``lr_t``, ``step_t``) and
the step never reads a value back to the host, so a step can be captured in a CUDA graph
and a reload (``param_groups[0]["lr"] = x``) copies the value in.
``tests/unit/test_learner_adam.py`` checks it against torch.optim.Adam.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

GRAD_NORM_EPS = 1e-6  # as torch.nn.utils.clip_grad_norm_


class _Group(dict):
    """``param_groups[0]``: assigning "lr" also copies it into the device tensor."""

    def __init__(self, lr_t: torch.Tensor, **values: Any) -> None:
        self.lr_t = lr_t
        super().__init__(**values)
        self["lr"] = values["lr"]

    def __setitem__(self, key: str, value: Any) -> None:
        if key == "lr":
            value = float(value)
            self.lr_t.fill_(value)
        super().__setitem__(key, value)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value


def flatten_into(params: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat weights, flat gradients) of ``params``, each parameter's ``.data`` and ``.grad``
    turned into views of them (values kept, gradients zero). One device and dtype."""
    first = params[0]
    if any(p.device != first.device or p.dtype != first.dtype for p in params):
        raise ValueError("Adam needs every parameter on one device with one dtype")
    total = sum(p.numel() for p in params)
    flat = torch.empty(total, device=first.device, dtype=first.dtype)
    grad = torch.zeros_like(flat)
    offset = 0
    for p in params:
        n = p.numel()
        flat[offset:offset + n].copy_(p.detach().reshape(-1))
        p.data = flat[offset:offset + n].view_as(p)
        p.grad = grad[offset:offset + n].view_as(p)
        offset += n
    return flat, grad


class Adam:
    """Adam without weight decay or amsgrad. ``param_groups[0]["lr"]`` may be changed live.
    Every parameter gets a gradient (zero when backward did not reach it): a parameter
    whose gradient is always zero never moves, as with torch.optim's skipped ``None``."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, betas=(0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.flat, self.grad = flatten_into(self.params)
        device = self.flat.device
        self.lr_t = torch.zeros((), device=device)
        self.step_t = torch.zeros((), device=device, dtype=torch.float64)
        self.betas_t = torch.tensor(tuple(betas), device=device, dtype=torch.float64)
        self.param_groups: list[dict[str, Any]] = [_Group(self.lr_t, lr=float(lr), betas=tuple(betas),
                                                          eps=float(eps))]
        self.m = torch.zeros_like(self.flat)      # m_t
        self.v = torch.zeros_like(self.flat)      # v_t

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero every gradient in place (the views stay; ``set_to_none`` is accepted for
        torch.optim's signature and has no other effect)."""
        self.grad.zero_()

    @property
    def step_count(self) -> int:
        """Steps applied so far (reads the device: for checkpoints and tests)."""
        return int(self.step_t.item())

    def clip_grad_norm_(self, max_norm: float | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Scale the gradients to 2-norm <= ``max_norm`` (torch's clip_grad_norm_; None: no
        scaling); return (the norm before clipping, a 0-dim float gate: 1 when it is finite,
        else 0 with the gradients zeroed). No value is read back to the host."""
        norm = torch.linalg.vector_norm(self.grad)
        gate = torch.isfinite(norm).float()
        scale = gate if max_norm is None else torch.clamp(max_norm / (norm + GRAD_NORM_EPS), max=1.0) * gate
        self.grad.mul_(scale).nan_to_num_(0.0, 0.0, 0.0)  # (only a closed gate leaves any)
        return norm, gate

    @torch.no_grad()
    def step(self, gate: torch.Tensor | None = None) -> None:
        """θ ← θ − lr · m̂ / (√v̂ + ε), with bias-corrected moments. ``gate`` (0-dim float,
        on the device, gradients finite) 0 leaves θ, m, v and the step count as they were."""
        group = self.param_groups[0]
        (beta1, beta2), eps = group["betas"], group["eps"]
        gate_t = torch.ones((), device=self.flat.device) if gate is None else gate
        if gate is not None:
            self.grad.mul_(gate)
        self.step_t.add_(gate_t)
        bias = 1 - self.betas_t.pow(self.step_t.clamp(min=1))              # [1−β1^t, 1−β2^t]
        self.m.lerp_(self.grad, (1 - beta1) * gate_t)                     # m = β1·m + (1−β1)·g
        self.v.mul_(1 - (1 - beta2) * gate_t).addcmul_(self.grad, self.grad, value=1 - beta2)
        # m̂/(√v̂+ε) = m / (b1·√v/√b2 + b1·ε); the step size lr divides the denominator
        b1, root_b2 = bias[0].float(), bias[1].float().sqrt()
        denom = self.v.sqrt().mul_(b1 / root_b2).add_(b1 * eps).div_(self.lr_t * gate_t)
        self.flat.addcdiv_(self.m, denom, value=-1.0)

    def state_dict(self) -> dict:
        """Tensors and plain values only (loadable with ``torch.load(weights_only=True)``);
        the moments per parameter, as torch.optim lists them."""
        return {"step": self.step_count, "param_groups": [dict(self.param_groups[0])],
                "exp_avg": self._per_param(self.m), "exp_avg_sq": self._per_param(self.v)}

    def _per_param(self, flat: torch.Tensor) -> list[torch.Tensor]:
        sizes = [p.numel() for p in self.params]
        return [part.view_as(p) for part, p in zip(flat.split(sizes), self.params)]

    @property
    def exp_avg(self) -> list[torch.Tensor]:
        return self._per_param(self.m)

    @property
    def exp_avg_sq(self) -> list[torch.Tensor]:
        return self._per_param(self.v)

    def load_state_dict(self, state: dict) -> None:
        if len(state["exp_avg"]) != len(self.params):
            raise ValueError("optimizer state does not match the model's parameters")
        self.step_t.fill_(int(state["step"]))
        group = state["param_groups"][0]
        self.param_groups[0].update(lr=float(group["lr"]), betas=tuple(group["betas"]),
                                    eps=float(group["eps"]))
        self.betas_t.copy_(torch.tensor(self.param_groups[0]["betas"], dtype=torch.float64))
        for mine, saved in zip(self.exp_avg + self.exp_avg_sq, state["exp_avg"] + state["exp_avg_sq"]):
            mine.copy_(saved)



class Descends:
    """The gradient step shared by the replay learners (``DQNLearner``, ``SACLearner``); a
    job's rank (``replay_job_core.ReplayJobRank``) overrides it to average the gradient and
    ``stats`` across the ranks first."""

    def _descend(self, optimizer: Adam, loss: torch.Tensor | None, stats: torch.Tensor,
                 max_norm: float | None) -> tuple[torch.Tensor, torch.Tensor]:
        """zero_grad, backward, clip, the step gated off (on the device) when the loss or the
        gradient is not finite; (the gradient norm before clipping, ``stats``)."""
        assert loss is not None  # (only a job's rank without rows steps without a loss)
        optimizer.zero_grad()
        loss.backward()
        norm, gate = optimizer.clip_grad_norm_(max_norm)
        optimizer.step(gate * torch.isfinite(loss.detach()))
        return norm, stats
