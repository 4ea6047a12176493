"""RLlink for the benchmarks: pre-encoded CartPole frames and connected clients.

Frames are built and read with the shared codec (``rlinkd.client_lib.protocol.codec``)
and connections are client_lib's ``RLlinkClient``, so a benchmark speaks exactly the
protocol the daemon and every client speak. Benchmarks send the same pre-encoded frame
again and again (``client.sock.sendall(frame)``: no per-message encoding in the timed
path) of CartPole-sized episodes: 4 observation floats, Discrete(2) actions, 2 logits,
log-probs.
"""
from __future__ import annotations

import asyncio

import numpy as np

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.transport import DEFAULT_MAX_MESSAGE_BYTES, Address, RLlinkClient

from bench.harness.common import LOOPBACK

EPISODE_STEPS = 255
"""Steps per benchmark episode (terminated): 256 step records with its FINAL_OBS record."""
STEPS_PER_MESSAGE = 2 * EPISODE_STEPS
"""Env steps per RLlink message (510, about the default ``sampling.env_steps_per_sample``)."""


def frame(obj: dict) -> bytes:
    """One RLlink frame (header + body) of a JSON object, as the codec encodes it."""
    return codec.encode_body(obj)


def cartpole_obs(n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` CartPole observations well inside the declared Box (float32, shape [n, 4])."""
    return rng.uniform(-0.2, 0.2, size=(n, 4)).astype(np.float32)


def cartpole_episode(steps: int, rng: np.random.Generator, terminated: bool = True) -> dict:
    """One RLlink episode as client_lib sends it: obs, actions, rewards, logp, dist inputs."""
    obs = cartpole_obs(steps + 1, rng)
    logits = rng.normal(0, 0.1, size=(steps, 2)).astype(np.float32)
    return {"obs": obs.tolist(), "actions": rng.integers(0, 2, steps).tolist(),
            "rewards": [1.0] * steps, "is_terminated": terminated, "is_truncated": False,
            "action_logp": np.full(steps, -0.69, np.float32).tolist(),
            "action_dist_inputs": logits.tolist()}


def episodes_frame(msg_type: str = "EPISODES", steps: int = STEPS_PER_MESSAGE,
                   episode_steps: int = EPISODE_STEPS, seed: int = 0) -> bytes:
    """A pre-encoded EPISODES (or EPISODES_AND_GET_STATE) frame of ``steps`` env steps."""
    rng = np.random.default_rng(seed)
    episodes, left = [], steps
    while left > 0:
        n = min(episode_steps, left)
        episodes.append(cartpole_episode(n, rng))
        left -= n
    return frame({"type": msg_type, "episodes": episodes, "env_steps": steps})


def connect_tcp(port: int, timeout_s: float = 120.0) -> RLlinkClient:
    """A client_lib connection to 127.0.0.1:``port`` (TCP_NODELAY) after PING and GET_CONFIG."""
    client = RLlinkClient(Address("tcp", host=LOOPBACK, port=port), timeout_s=timeout_s).connect()
    client.ping()
    client.get_config()
    return client


async def read_body(reader: asyncio.StreamReader) -> bytes:
    """The body of the next frame on an asyncio stream (header checked by the codec)."""
    header = await reader.readexactly(codec.HEADER_BYTES)
    return await reader.readexactly(codec.parse_header(header, DEFAULT_MAX_MESSAGE_BYTES))
