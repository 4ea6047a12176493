"""Which device trains a policy: a fixed ``learner.device`` checked against the host, or
``auto`` decided by measurement.

Pure apart from the cache file: the timing function is passed in (``step_timing.time_sgd_step``
in production, a table in tests), so both outcomes are testable on a host without CUDA.

``auto`` on a host without a CUDA device is the CPU, untimed (there is nothing to choose).
With CUDA devices it times the policy's SGD step on the CPU and on each of them, trains on
the fastest (the CPU wins a tie: it needs no copies) and caches the answer in the state
directory, keyed by network, minibatch and host: timing a CNN on a 2-core CPU takes
seconds, and the same host, network and minibatch give the same answer at every start.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CACHE_FILE = "device_choice.json"
TimeFn = Callable[[str], float]
"""A candidate device ("cpu", "cuda:0") -> seconds per SGD step of the policy's network."""


class DeviceUnavailable(ValueError):
    """``learner.device`` names a device this host does not have (a boot error)."""


@dataclass(frozen=True)
class DeviceChoice:
    """The device a policy trains on and why: ``how`` is ``fixed`` (the config named it),
    ``only_cpu`` (auto on a host without CUDA), ``measured`` or ``cached``; ``step_s`` holds
    the seconds per SGD step of each timed candidate (empty when none was timed)."""

    device: str
    how: str
    step_s: dict[str, float] = field(default_factory=dict)


def device_fields(choice: DeviceChoice) -> dict:
    """The ``LearnerState`` fields (``rlinkd status``) describing ``choice``."""
    return {"device": choice.device, "device_choice": choice.how,
            "device_step_s": dict(choice.step_s)}


def candidates(cuda_count: int) -> list[str]:
    """The devices ``auto`` chooses among, the CPU first."""
    return ["cpu"] + [f"cuda:{i}" for i in range(cuda_count)]


def require_device(name: str, cuda_count: int) -> str:
    """The torch device string of a fixed ``learner.device`` (cpu, cuda, cuda:N);
    DeviceUnavailable, with one line naming ``learner.device``, when the host lacks it."""
    if name == "cpu":
        return "cpu"
    index = int(name.partition(":")[2] or 0)
    if cuda_count == 0:
        raise DeviceUnavailable(f"learner.device = {name!r}: this host has no CUDA device "
                                "(use auto or cpu)")
    if index >= cuda_count:
        raise DeviceUnavailable(f"learner.device = {name!r}: this host has {cuda_count} CUDA "
                                f"device(s), cuda:0 to cuda:{cuda_count - 1}")
    return f"cuda:{index}"


def choose(devices: Sequence[str], time_fn: TimeFn, cache: ChoiceCache | None = None,
           key: str = "") -> DeviceChoice:
    """The fastest of ``devices`` by ``time_fn`` (the first wins a tie), from ``cache`` under
    ``key`` when it holds an answer naming one of them; a measured answer is stored there
    unless a device could not be timed (``time_fn`` returned inf: measured again next time)."""
    if len(devices) == 1:
        return DeviceChoice(devices[0], "only_cpu")
    hit = cache.get(key) if cache is not None else None
    if hit is not None and hit.device in devices:
        return hit
    step_s = {device: float(time_fn(device)) for device in devices}
    best = min(devices, key=lambda d: step_s[d])
    choice = DeviceChoice(best, "measured", step_s)
    if cache is not None and all(math.isfinite(t) for t in step_s.values()):
        cache.put(key, choice)
    return choice


def cache_key(network: object, minibatch: int, host: str) -> str:
    """A digest of the network description (JSON-able), the minibatch size and the host."""
    text = json.dumps([network, minibatch, host], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class ChoiceCache:
    """Measured choices in a JSON file (``{key: {"device", "step_s"}}``). A file that cannot
    be read or parsed is an empty cache (it is rewritten at the next measurement)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def _entries(self) -> dict:
        try:
            entries = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return entries if isinstance(entries, dict) else {}

    def get(self, key: str) -> DeviceChoice | None:
        entry: Any = self._entries().get(key)
        try:
            return DeviceChoice(str(entry["device"]), "cached",
                                {str(k): float(v) for k, v in entry["step_s"].items()})
        except (TypeError, KeyError, ValueError, AttributeError):
            return None

    def put(self, key: str, choice: DeviceChoice) -> None:
        """Store ``choice`` under ``key`` (written to a temporary file, then renamed)."""
        entries = self._entries()
        entries[key] = {k: v for k, v in asdict(choice).items() if k != "how"}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(entries, indent=1, sort_keys=True))
        tmp.replace(self.path)
