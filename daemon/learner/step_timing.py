"""The production timing function of ``device_choice``: seconds per SGD step of a policy's
own network at its minibatch size on one device.

The step timed is the shape of every algorithm's step: a forward pass of the network
(``ActorCritic(spec)``: the actor-critic of PPO/APPO, the Q-network of DQN, SAC's actor),
a backward pass, gradient clipping and an Adam update, on CUDA captured as the learners
capture their steps (a recurrent network's over chunks of max_seq_len steps, eagerly, as the
learner runs it). SAC's real step runs five networks and three backward passes: its timing
is of the actor's shape only, so its choice is an approximation. Inputs are zeros of the observation records' dtypes
(a uint8 image stays uint8): timing does not depend on the values.
"""
from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable

import numpy as np
import torch

from rlinkd.client_lib.protocol import netops as N
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.daemon.learner.adam import Adam
from rlinkd.daemon.learner.bptt import chunks_per_minibatch
from rlinkd.daemon.learner.graphed import make_stepper
from rlinkd.daemon.learner.model import ActorCritic

WARMUP_STEPS = 2   # allocator, cuDNN algorithm choice, lazy CUDA initialisation
TIMED_STEPS = 5


def time_sgd_step(spec: PolicySpec, minibatch: int, device: str,
                  steps: int = TIMED_STEPS, graphs: bool = True) -> float:
    """Median seconds of ``steps`` SGD steps (after WARMUP_STEPS) on ``device``, run as the
    learner runs them there: on CUDA a captured graph (see ``graphed``), except for a
    recurrent network, whose steps (truncated BPTT over chunks) the learner runs eagerly,
    and when ``graphs`` is False (a job's learner, whose step holds a collective)."""
    dev = torch.device(device)
    model = ActorCritic(spec).to(dev)
    opt = Adam(model.parameters(), lr=1e-4, eps=1e-5)
    data, forward = _inputs(spec, model, minibatch, dev)

    def step(data: dict, idx: torch.Tensor) -> torch.Tensor:
        dist, value = forward(data, idx)
        loss = dist.square().mean() + value.square().mean()  # [] any loss of both heads
        opt.zero_grad()
        loss.backward()
        _, gate = opt.clip_grad_norm_(0.5)
        opt.step(gate)
        return gate
    run = make_stepper(dev, step, [opt.flat, opt.grad, opt.m, opt.v, opt.step_t],
                       graphs=graphs and not spec.state_size, what="device timing").bind(data, minibatch)
    idx = torch.arange(minibatch, device=dev)
    times = []
    for i in range(WARMUP_STEPS + steps):
        start = time.perf_counter()
        run(idx)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        if i >= WARMUP_STEPS:
            times.append(time.perf_counter() - start)
    return float(np.median(times))


Forward = Callable[[dict, torch.Tensor], list[torch.Tensor]]


def _inputs(spec: PolicySpec, model: ActorCritic, minibatch: int, dev: torch.device
            ) -> tuple[dict, Forward]:
    """Zero observations of a minibatch and the forward pass over them: ``minibatch`` rows,
    or for a recurrent network the whole chunks of max_seq_len steps they hold, from zero
    states (``bptt``)."""
    if not spec.state_size:
        obs = _zeros(spec, (minibatch,), dev)
        return {"obs": obs}, lambda data, idx: model.run(
            {k: v[idx] for k, v in data["obs"].items()}, (N.DIST, N.VALUE))
    steps, chunks = spec.max_seq_len, chunks_per_minibatch(minibatch, spec.max_seq_len)
    state0 = torch.zeros(chunks, spec.state_size, device=dev)
    starts = torch.zeros(steps, chunks, device=dev)
    return {"obs": _zeros(spec, (steps, chunks), dev)}, lambda data, idx: model.run_sequence(
        data["obs"], state0, starts, (N.DIST, N.VALUE))


def _zeros(spec: PolicySpec, rows: tuple[int, ...], dev: torch.device) -> dict[str, torch.Tensor]:
    return {leaf.key: torch.from_numpy(np.zeros((*rows, *leaf.space.record_shape),
                                                leaf.space.record_dtype)).to(dev)
            for leaf in spec.obs_space.leaves()}


def host_signature(torch_threads: int) -> str:
    """What makes timings on this host comparable: its name, CPU count, torch version,
    intra-op threads and the names of its CUDA devices."""
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return "|".join([platform.node(), str(os.cpu_count()), torch.__version__,
                     str(torch_threads), *gpus])
