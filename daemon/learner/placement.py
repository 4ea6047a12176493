"""Where a policy trains: ``device_choice`` applied to one policy of the config (the thin
wiring between the pure choice, the timing function, the state directory and the log)."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import structlog
import torch

from rlinkd.daemon.config import Config
from rlinkd.daemon.learner.device_choice import (CACHE_FILE, ChoiceCache, DeviceChoice,
                                                 DeviceUnavailable, TimeFn, cache_key, candidates,
                                                 choose, require_device)
from rlinkd.daemon.learner.step_timing import host_signature, time_sgd_step
from rlinkd.daemon.policies import PolicyDef
from rlinkd.daemon.roles import BootError

T = TypeVar("T")

log = structlog.get_logger("learner")


def minibatch_of(definition: PolicyDef) -> int:
    """Rows per SGD step of the policy's algorithm."""
    if definition.uses_replay:
        return definition.replay_hp.batch_size
    return definition.ppo.minibatch_size


def steps_graphed(cfg: Config) -> bool:
    """Whether the learners may capture their SGD step (on CUDA): not in a job ([cluster]
    world_size > 1), whose learners step eagerly because a graph cannot hold the collective."""
    return cfg.cluster.world_size == 1


def place(definition: PolicyDef, cfg: Config, time_fn: TimeFn | None = None,
          cuda_count: int | None = None) -> DeviceChoice:
    """The device ``definition``'s policy trains on, logged (``learner_device``); BootError
    naming ``learner.device`` when a fixed device does not exist here. ``time_fn`` and
    ``cuda_count`` default to the real step timing and torch's device count (tests inject).
    The step timed is the one the learner will run: captured alone, eager in a job."""
    count = torch.cuda.device_count() if cuda_count is None else cuda_count
    name, threads = cfg.learner.device, cfg.learner.torch_threads
    if name != "auto":
        try:
            choice = DeviceChoice(require_device(name, count), "fixed")
        except DeviceUnavailable as exc:
            raise BootError(str(exc)) from None
    else:
        minibatch, graphs = minibatch_of(definition), steps_graphed(cfg)
        timer = time_fn or (lambda device: _timed(definition, minibatch, device, threads, graphs))
        network = definition.spec.to_json() if graphs else [definition.spec.to_json(), "eager"]
        key = cache_key(network, minibatch, host_signature(threads))
        choice = choose(candidates(count), timer, ChoiceCache(cfg.state_dir / CACHE_FILE), key)
    log.info("learner_device", policy=definition.name, device=choice.device, how=choice.how,
             step_s=choice.step_s or None)
    return choice


def _timed(definition: PolicyDef, minibatch: int, device: str, threads: int,
           graphs: bool) -> float:
    """Seconds per SGD step on ``device`` (captured on CUDA when ``graphs``); inf (logged)
    when a GPU fails to run it (out of memory, a driver error): the policy then trains on the
    CPU rather than not at all. A failure on the CPU is a BootError naming ``learner.device``
    (a restart would fail alike)."""
    if threads > 0:
        torch.set_num_threads(threads)
    try:
        return time_sgd_step(definition.spec, minibatch, device, graphs=graphs)
    except Exception as exc:  # (the timing boundary: any failure decides, never crashes)
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if device == "cpu":
            raise BootError(f"learner.device = 'auto': timing policy {definition.name!r}'s step "
                            f"on the cpu failed ({type(exc).__name__}: {reason})") from exc
        log.warning("device_timing_failed", policy=definition.name, device=device, error=reason)
        return math.inf


def built_on(device: str, cfg: Config, make: Callable[[], T]) -> T:
    """``make()``, the learner core built on ``device``; the RuntimeError torch raises when
    the device cannot hold it becomes the BootError naming ``learner.device`` (the daemon
    stops at once, exit 3: a restart could not help)."""
    try:
        return make()
    except RuntimeError as exc:
        raise BootError(f"learner.device = {cfg.learner.device!r}: cannot create the learner "
                        f"on {device}: {exc}") from exc
