"""The torch backend of the inference role: the learner's own module (``ActorCritic``) on
CUDA when there is one, else on the CPU; on CUDA served from a captured graph per batch-size
bucket (``cuda_graphs``). Its forwards and steps are ``Reloadable``: a newer weights version
is copied into the module in place, and the captured graphs keep reading it (no recapture
per version). torch is imported inside the functions (it costs seconds and hundreds of MB;
a daemon that never chooses torch never loads it)."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rlinkd.client_lib.protocol.netops import DIST, STATE_IN, STATE_OUT
from rlinkd.client_lib.protocol.policy_spec import PolicySpec


class Reloadable:
    """A forward or step that takes a newer version's weights in place (``load``): the
    torch backend's, whose captured graphs keep reading its parameters (no recapture)."""

    def __init__(self, run: Callable, load: Callable[[np.ndarray], None]) -> None:
        self.run, self.load = run, load

    def __call__(self, *args: Any) -> Any:
        return self.run(*args)


def reloaded(made: Any, make: Callable[[PolicySpec, np.ndarray], Any], spec: PolicySpec,
             flat: np.ndarray) -> Any:
    """``made`` with ``flat`` loaded into it when it is ``Reloadable``, else ``make(spec, flat)``."""
    if isinstance(made, Reloadable):
        made.load(flat)
        return made
    return make(spec, flat)


def torch_model(spec: PolicySpec, flat: np.ndarray) -> tuple[Any, Any]:
    """(the learner's own module with ``flat`` loaded, for inference; its device): CUDA when
    there is one, else the CPU (imports torch)."""
    import torch

    from rlinkd.daemon.learner.model import ActorCritic
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = ActorCritic(spec).to(device)
    model.load_flat(flat)
    model.train(False)
    return model, device


def torch_forward(spec: PolicySpec, flat: np.ndarray) -> Reloadable:
    """The learner's module (``torch_model``); on CUDA replayed from a captured graph per
    batch-size bucket (``cuda_graphs``)."""
    import torch

    from rlinkd.daemon.inference.cuda_graphs import served
    model, device = torch_model(spec, flat)
    net = served(lambda x: (model.dist_inputs(x),), device, "forward")

    def run(obs: Mapping[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            x = {k: torch.as_tensor(np.ascontiguousarray(v), device=device) for k, v in obs.items()}
            return net(x)[0].float().cpu().numpy()
    return Reloadable(run, model.load_flat)


def torch_step(spec: PolicySpec, flat: np.ndarray) -> Reloadable:
    """The learner's module (as ``torch_forward``, graphed on CUDA) one step at a time; the
    state rides with the observations as input ``STATE_IN`` (imports torch)."""
    import torch

    from rlinkd.daemon.inference.cuda_graphs import served
    model, device = torch_model(spec, flat)

    def step(x: dict) -> tuple:
        obs = {k: v for k, v in x.items() if k != STATE_IN}
        return tuple(model.run(obs, (DIST, STATE_OUT), x[STATE_IN]))
    net = served(step, device, "step")

    def run(obs: Mapping[str, np.ndarray], state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with torch.inference_mode():
            x = {k: torch.as_tensor(np.ascontiguousarray(v), device=device) for k, v in obs.items()}
            dist, state_out = net({**x, STATE_IN: torch.as_tensor(state, device=device)})
            return dist.float().cpu().numpy(), state_out.float().cpu().numpy()
    return Reloadable(run, model.load_flat)
