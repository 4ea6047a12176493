"""What the inference role's serving turn keeps per policy (``PolicyServing``) and counts
(``ServingStats``: requests, actions, forward passes and their sizes, for status)."""
from __future__ import annotations

from dataclasses import dataclass, field

from rlinkd.client_lib.protocol.serving import EvalEpisode
from rlinkd.client_lib.protocol.spaces import Space
from rlinkd.daemon.inference.backend import PolicyRunner
from rlinkd.daemon.inference.episodes import SlotPool
from rlinkd.daemon.inference.link import PolicyLink
from rlinkd.daemon.inference.lonestep import LoneStepper

HISTOGRAM_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


@dataclass
class ServingStats:
    requests: int = 0
    actions: int = 0
    batches: int = 0
    errors: int = 0
    histogram: list[int] = field(default_factory=lambda: [0] * len(HISTOGRAM_BOUNDS))

    def batch(self, size: int) -> None:
        self.batches += 1  # the bounds are the powers of two: bucket = ceil(log2(size))
        self.histogram[min((size - 1).bit_length(), len(HISTOGRAM_BOUNDS) - 1)] += 1

    def lone(self, count: int) -> None:
        """``count`` lone requests answered natively: a batch of one action each."""
        self.batches += count
        self.histogram[0] += count
        self.actions += count
        self.requests += count


@dataclass
class PolicyServing:
    """What the loop needs per policy: its runner, spaces, slot pool and (trainable) link."""

    runner: PolicyRunner
    obs_space: Space
    slots: SlotPool
    link: PolicyLink | None
    sample_steps: int
    eval_ends: list[EvalEpisode] = field(default_factory=list)
    off_policy: bool = False  # DQN: never held for training; WEIGHTS_READY still asked for (epsilon)
    lone: LoneStepper | None = None  # (made with the policy's lanes: its spaces allow the native step)

    @property
    def held(self) -> bool:
        """Training requests wait: for weights trained on the last sample (on-policy), or for
        the link to the collector (its steps would be lost)."""
        return self.link is not None and (self.link.held or not self.link.connected)
