"""Step records of a recurrent policy as the acting side writes them, built in-process for
tests of the connector and learner: an actor runs the numpy network step by step, zeroes its
state when an episode starts, and each fragment of T steps carries the actor's state before
its steps 0, L, 2L, ... (HAS_STATE rows of the records' state field)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlinkd.client_lib.protocol import netops
from rlinkd.client_lib.protocol.netnumpy import NumpyNet
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import Box, Discrete
from rlinkd.shm.records import FINAL_OBS, HAS_LOGP, HAS_STATE, TERMINATED, StepLayout


def small_spec(cell: str = "lstm", max_seq_len: int = 4) -> PolicySpec:
    return PolicySpec(Box((3,)), Discrete(2), hidden_sizes=(8,), recurrent=cell,
                      recurrent_size=5, max_seq_len=max_seq_len)


def noisy_weights(spec: PolicySpec, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return spec.init_flat(rng) + rng.normal(0.0, 0.3, spec.n_params()).astype(np.float32)


def layout_of(spec: PolicySpec) -> StepLayout:
    return StepLayout.flat(spec.obs_size, spec.action_size, spec.dist_size, state_size=spec.state_size)


@dataclass
class ActedEpisode:
    obs: np.ndarray         # [T+1, obs_size]
    actions: np.ndarray     # [T]
    states: np.ndarray      # [T, S] the actor's state BEFORE each step
    values: np.ndarray      # [T] V(s_t) the actor's network computed
    logp: np.ndarray        # [T]


def act_episode(spec: PolicySpec, flat: np.ndarray, steps: int, seed: int) -> ActedEpisode:
    """One episode acted step by step from a zero state (the acting side's contract)."""
    rng = np.random.default_rng(seed)
    net = NumpyNet(spec, flat, (netops.DIST, netops.VALUE))
    obs = rng.uniform(-0.1, 0.1, (steps + 1, spec.obs_size)).astype(np.float32)  # (inside CartPole's box)
    state = np.zeros((1, spec.state_size), np.float32)
    states, values, actions, logp = [], [], [], []
    for t in range(steps):
        states.append(state[0])
        out = net.run({"": obs[t:t + 1]}, state)
        action = np.array([[float(rng.integers(2))]], np.float32)
        actions.append(action[0, 0])
        logp.append(float(spec.log_prob(out[netops.DIST], action)[0]))
        values.append(out[netops.VALUE][0, 0])
        state = out[netops.STATE_OUT]
    return ActedEpisode(obs, np.array(actions, np.float32), np.array(states),
                        np.array(values, np.float32), np.array(logp, np.float32))


def fragment_records(spec: PolicySpec, ep: ActedEpisode, begin: int, end: int, stream: int,
                     terminated: bool, first_ingest: int) -> np.ndarray:
    """Records of the fragment steps [begin, end) of ``ep`` (+ its FINAL_OBS record): the state
    field and HAS_STATE on fragment positions 0, L, 2L, ..."""
    t = end - begin
    rec = np.zeros(t + 1, layout_of(spec).dtype)
    rec["obs"]["obs"] = ep.obs[begin:end + 1]
    rec["stream_id"], rec["weights_seq_no"] = stream, -1
    rec["ingest_id"] = np.arange(first_ingest, first_ingest + t + 1)
    rec["action"][:t, 0] = ep.actions[begin:end]
    rec["logp"][:t] = ep.logp[begin:end]
    rec["reward"][:t] = 1.0
    rec["flags"][:t] = HAS_LOGP
    grid = np.arange(0, t, spec.max_seq_len)
    rec["flags"][grid] |= HAS_STATE
    rec["state"][grid] = ep.states[begin + grid]
    rec["flags"][t] = FINAL_OBS | (TERMINATED if terminated else 0)
    return rec


def pipeline_batch(spec: PolicySpec, flat: np.ndarray, algorithm: str = "ppo", episodes: int = 6,
                   fragment_steps: int = 7, seed: int = 0) -> dict:
    """A train batch the connector's pipeline builds from acted episodes (lengths 5..24), each
    sent in fragments of ``fragment_steps`` steps (so cut off the state grid's period)."""
    from rlinkd.daemon.connector.pipeline import LearnerPipeline, PipelineContext, pipeline_for
    from rlinkd.daemon.connector.segments import SegmentAssembler

    rng = np.random.default_rng(seed)
    segments, ingest = [], 1
    for e in range(episodes):
        steps = int(rng.integers(5, 25))
        ep = act_episode(spec, flat, steps, seed=seed * 100 + e)
        for begin in range(0, steps, fragment_steps):
            end = min(begin + fragment_steps, steps)
            rec = fragment_records(spec, ep, begin, end, e, end == steps, ingest)
            ingest += len(rec)
            segments += SegmentAssembler().add(rec)
    names = ("observations", "columns", "old_logp", "values", "gae", "normalize_advantages")
    ctx = PipelineContext(Box((3,)), Discrete(2), spec, flat, 0, 0.9, 0.8, True)
    return LearnerPipeline(pipeline_for(names, algorithm, recurrent=True))(segments, ctx)
