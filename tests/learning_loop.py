"""The daemon's learning path in one thread, for learning runs of recurrent and feed-forward
PPO policies without sockets or roles: actors step gymnasium environments with the numpy
network (state kept per environment, zeroed when an episode starts), each environment's steps
go out as fragments of step records (the state field and HAS_STATE on the fragment's grid
rows, as the acting side writes them), and the connector's SegmentAssembler, BatchBuilder and
pipeline build the train batches the Learner trains on, exactly as the daemon's roles do.

On-policy like an RLlink client under ``force_on_policy``: every ``rollout_steps`` steps per
environment the open fragments are sent (cut), the batch is trained, and acting continues with
the new weights (each continuation fragment starts with the actor's state on its row 0).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch

from rlinkd.client_lib.protocol import netops
from rlinkd.client_lib.protocol.netnumpy import NumpyNet
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import Box, Discrete
from rlinkd.daemon.config import PPOConfig
from rlinkd.daemon.connector.builder import BatchBuilder
from rlinkd.daemon.connector.pipeline import LearnerPipeline, PipelineContext, pipeline_for
from rlinkd.daemon.connector.segments import SegmentAssembler
from rlinkd.daemon.learner.learner import Learner
from rlinkd.daemon.policies import make_policy_spec
from rlinkd.shm.records import FINAL_OBS, HAS_LOGP, HAS_STATE, TERMINATED, TRUNCATED, StepLayout

PIPELINE = ("observations", "columns", "old_logp", "values", "gae", "normalize_advantages")


@dataclass
class Fragment:
    """One environment's open fragment: observations, actions, log-probs, rewards, states."""

    obs: list = field(default_factory=list)
    actions: list = field(default_factory=list)
    logp: list = field(default_factory=list)
    rewards: list = field(default_factory=list)
    states: list = field(default_factory=list)


@dataclass
class RunResult:
    env_steps: int
    curve: list[tuple[int, float]]           # (env steps, greedy mean return) at each evaluation
    solved_at: int | None                    # first evaluation with the greedy return >= target
    wall_s: float
    learner: Learner


def records(spec: PolicySpec, frag: Fragment, final_obs, stream: int, ended: int) -> np.ndarray:
    """The fragment as step records + its FINAL_OBS record (``ended``: TERMINATED/TRUNCATED/0)."""
    t = len(frag.actions)
    layout = StepLayout.flat(len(final_obs), spec.action_size, spec.dist_size, state_size=spec.state_size)
    rec = np.zeros(t + 1, layout.dtype)
    rec["obs"]["obs"] = np.stack([*frag.obs, final_obs])
    rec["stream_id"], rec["weights_seq_no"] = stream, -1
    rec["action"][:t, 0], rec["logp"][:t], rec["reward"][:t] = frag.actions, frag.logp, frag.rewards
    rec["flags"][:t] = HAS_LOGP
    if spec.state_size:
        grid = np.arange(0, t, spec.max_seq_len)
        rec["flags"][grid] |= HAS_STATE
        rec["state"][grid] = np.stack(frag.states)[grid]
    rec["flags"][t] = FINAL_OBS | ended
    return rec


class Actors:
    """``n`` environments acted by one weights version at a time (sampling, or greedy)."""

    def __init__(self, spec: PolicySpec, env_id: str, n: int, seed: int) -> None:
        self.spec, self.n = spec, n
        self.envs = [gym.make(env_id) for _ in range(n)]
        self.obs = np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(self.envs)]).astype(np.float32)
        self.state = np.zeros((n, spec.state_size), np.float32)
        self.frags = [Fragment() for _ in range(n)]
        self.rng = np.random.default_rng(seed)
        self.net: NumpyNet | None = None

    def set_weights(self, flat: np.ndarray) -> None:
        self.net = NumpyNet(self.spec, flat, (netops.DIST,))

    def forward(self, obs: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        assert self.net is not None
        out = self.net.run({"": obs}, state if self.spec.state_size else None)
        return out[netops.DIST], out.get(netops.STATE_OUT, state)

    def step(self) -> list[np.ndarray]:
        """One step of every environment; the record batches of the fragments that ended."""
        dist, next_state = self.forward(self.obs, self.state)
        actions = self.spec.sample_actions(dist, self.rng)
        logp = self.spec.log_prob(dist, actions)
        done = []
        for i, env in enumerate(self.envs):
            frag = self.frags[i]
            frag.obs.append(self.obs[i].copy())
            frag.states.append(self.state[i].copy())
            frag.actions.append(actions[i, 0])
            frag.logp.append(logp[i])
            obs, reward, term, trunc, _ = env.step(int(actions[i, 0]))
            frag.rewards.append(reward)
            self.state[i] = next_state[i]
            self.obs[i] = obs
            if term or trunc:
                done.append(records(self.spec, frag, obs, i, TERMINATED if term else TRUNCATED))
                self.obs[i], _ = env.reset()
                self.state[i] = 0.0                                       # a new episode
                self.frags[i] = Fragment()
        return done

    def cut(self) -> list[np.ndarray]:
        """Send every open fragment (continued by the next one, from the same state)."""
        out = [records(self.spec, f, self.obs[i], i, 0) for i, f in enumerate(self.frags) if f.actions]
        self.frags = [Fragment() for _ in range(self.n)]
        return out

    def greedy_return(self, env_id: str, episodes: int, seed: int) -> float:
        """Mean return of ``episodes`` episodes acting greedily (argmax), state from zeros."""
        env, total = gym.make(env_id), 0.0
        for e in range(episodes):
            obs, _ = env.reset(seed=seed + e)
            state = np.zeros((1, self.spec.state_size), np.float32)
            done = False
            while not done:
                dist, state = self.forward(np.asarray(obs, np.float32)[None], state)
                obs, reward, term, trunc, _ = env.step(int(np.argmax(dist[0])))
                total += reward
                done = term or trunc
        return total / episodes


def make_spec(hp: PPOConfig, obs_size: int, n_actions: int) -> PolicySpec:
    return make_policy_spec(hp, Box((obs_size,), low=-5.0, high=5.0), Discrete(n_actions), "")


def train(hp: PPOConfig, env_id: str, total_steps: int, *, n_envs: int = 8, rollout_steps: int = 32,
          seed: int = 0, eval_every_steps: int = 10_000, eval_episodes: int = 3,
          target: float = 500.0, stop_when_solved: bool = True) -> RunResult:
    """PPO (recurrent or not, as ``hp`` says) on ``env_id`` for ``total_steps`` env steps
    through the daemon's connector pipeline and learner; greedy evaluations along the way."""
    torch.manual_seed(seed)
    probe = gym.make(env_id)
    spec = make_spec(hp, probe.observation_space.shape[0], int(probe.action_space.n))
    learner = Learner(spec, hp, device="cpu", seed=seed, torch_threads=1, graphs=False)
    actors = Actors(spec, env_id, n_envs, seed)
    actors.set_weights(learner.flat_weights())
    batch_rows = n_envs * rollout_steps
    builder = BatchBuilder(batch_rows, 4 * batch_rows, None)
    pipeline = LearnerPipeline(pipeline_for(PIPELINE, "ppo", recurrent=bool(spec.state_size)))
    steps, curve, solved, start, next_eval = 0, [], None, time.perf_counter(), eval_every_steps
    while steps < total_steps:
        for _ in range(rollout_steps):
            for rec in actors.step():
                builder.add(SegmentAssembler().add(rec))
        for rec in actors.cut():
            builder.add(SegmentAssembler().add(rec))
        steps += batch_rows
        flat = learner.flat_weights()
        ctx = PipelineContext(spec.obs_space, spec.act_space, spec, flat, 0, hp.gamma, hp.gae_lambda,
                              hp.normalize_advantages)
        learner.update(pipeline(builder.take(0, 0).segments, ctx))
        actors.set_weights(learner.flat_weights())
        if steps >= next_eval or steps >= total_steps:
            next_eval += eval_every_steps
            curve.append((steps, actors.greedy_return(env_id, eval_episodes, seed=10_000 + steps)))
            if solved is None and curve[-1][1] >= target:
                solved = steps
                if stop_when_solved:
                    break
    return RunResult(steps, curve, solved, time.perf_counter() - start, learner)
