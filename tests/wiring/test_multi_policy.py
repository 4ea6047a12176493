"""Tier 2: two trainable policies and a policy mapping, fed by raw RLlink JSON over TCP with
agent ids (every role a thread of the test process)."""
from __future__ import annotations

import os
import socket
import threading

import numpy as np
import pytest

from rlinkd.daemon.roster import ROLES
from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol.codec import EpisodeFragment
from rlinkd.client_lib.shm_client import receive_ring_fd
from rlinkd.client_lib.transport import RLlinkClient, ServerError
from rlinkd.daemon.config import load_config
from rlinkd.daemon.inprocess import InProcessDaemon
from rlinkd.shm.records import FINAL_OBS, TERMINATED, StepLayout
from rlinkd.shm.ring import StepRing

CONFIG = """
[policies.red]
trainable = true

[policy_mapping]
"red_*" = "red"
"""


class RawClient:
    """RLlink frames over a plain socket: no client_lib, only the codec."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120.0)

    def send(self, msg: codec.Message) -> None:
        self.sock.sendall(codec.encode(msg))

    def recv(self) -> codec.Message:
        size = codec.parse_header(self._exactly(codec.HEADER_BYTES), 1 << 30)
        return codec.decode_body(self._exactly(size))

    def _exactly(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("server closed the connection")
            buf += chunk
        return buf

    def close(self) -> None:
        self.sock.close()


def fragment(rng, agent: str, steps: int, done: bool) -> EpisodeFragment:
    obs = rng.uniform(-0.05, 0.05, (steps + 1, 4)).tolist()
    return EpisodeFragment(obs=obs, actions=rng.integers(0, 2, steps).tolist(),
                           rewards=np.ones(steps), is_terminated=done, is_truncated=False,
                           agent_id=agent)


@pytest.fixture
def two_policies(tmp_path):
    path = tmp_path / "rlinkd.toml"
    path.write_text(CONFIG)
    cfg = load_config(path, [("daemon", "state_dir", str(tmp_path / "state")),
                             ("server", "port", 0),
                             ("sampling", "train_batch_size", 200),
                             ("sampling", "max_wait_for_batch_s", 1.0),
                             ("ppo", "minibatch_size", 100)])
    d = InProcessDaemon(cfg).start()
    yield d
    assert d.stop() == {role: 0 for role in ROLES}


def run_rounds(port: int, agents: list[str], steps: int, rounds: int, out: dict) -> None:
    """On-policy sampler: EPISODES_AND_GET_STATE with one fragment per agent, ``rounds``
    times; records every SET_STATE it gets."""
    rng = np.random.default_rng(len(agents) * steps)
    client = RawClient(port)
    try:
        client.send(codec.Ping())
        assert isinstance(client.recv(), codec.Pong)
        for i in range(rounds):
            frags = tuple(fragment(rng, a, steps, done=i % 2 == 1) for a in agents)
            client.send(codec.EpisodesAndGetState(episodes=frags))
            reply = client.recv()
            assert isinstance(reply, codec.SetState), reply
            out.setdefault("states", []).append(reply)
    finally:
        client.close()


def test_two_policies_train_independently_and_a_thin_policy_never_blocks_the_other(two_policies):
    port = two_policies.listening.port
    blue: dict = {}
    red: dict = {}
    threads = [threading.Thread(target=run_rounds, args=(port, ["blue_0", "blue_1"], 200, 6, blue)),
               threading.Thread(target=run_rounds, args=(port, ["red_0"], 10, 6, red))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240.0)
    assert not any(t.is_alive() for t in threads), "a sampler is stuck waiting for weights"
    assert len(blue["states"]) == 6 and len(red["states"]) == 6
    blue_seqs = [s.weights_seq_no for s in blue["states"]]
    red_seqs = [s.policies["red"]["weights_seq_no"] for s in red["states"]]
    assert blue_seqs == sorted(blue_seqs) and blue_seqs[-1] >= 6
    assert red_seqs == sorted(red_seqs) and red_seqs[-1] >= 1   # flushed: 10 steps a sample
    assert red["states"][0].policies["red"]["onnx_file"]       # the client had no red version

    client = RawClient(port)
    try:
        client.send(codec.GetState(weights_seq_nos={"red": red_seqs[-1]}))
        state = client.recv()
        assert isinstance(state, codec.SetState) and state.onnx_file
        if state.policies["red"]["weights_seq_no"] == red_seqs[-1]:
            assert "onnx_file" not in state.policies["red"]          # it holds that one
        client.send(codec.Status())
        status = client.recv().status
    finally:
        client.close()
    policies = status["policies"]
    assert policies["default"]["env_steps"] == 6 * 2 * 200 and policies["red"]["env_steps"] == 60
    assert policies["default"]["episodes"] == 3 * 2 and policies["red"]["episodes"] == 3
    assert status["env_steps"] == 6 * 2 * 200 + 60
    assert policies["red"]["learner"]["updates"] >= 1 and policies["red"]["trainable"] is True
    assert status["agents"] == 0


def slot_records(layout: StepLayout, slots: list[int], steps: int) -> np.ndarray:
    """One terminated episode of ``steps`` steps per agent slot, the slots interleaved."""
    per_slot = []
    for slot in slots:
        rec = layout.empty(steps + 1)
        rec["obs"]["obs"] = np.linspace(-0.04, 0.04, 4)
        rec["stream_id"], rec["reward"] = slot, 1.0
        rec["reward"][-1] = 0.0
        rec["flags"][-1] = FINAL_OBS | TERMINATED
        per_slot.append(rec)
    out = layout.empty(len(slots) * (steps + 1))
    for i, rec in enumerate(per_slot):
        out[i::len(slots)] = rec
    return out


def test_one_shm_connection_with_a_ring_per_policy_and_agent_slots(two_policies):
    address = f"unix://{two_policies.listening.unix_socket}"
    with RLlinkClient(address) as client:
        client.ping()
        rings = {}
        for policy in ("default", "red"):
            attached = client.request(codec.Attach(pid=os.getpid(), policy=policy), codec.Attached)
            assert attached.policy == policy
            layout = StepLayout.from_json(attached.layout)
            rings[policy] = StepRing.attach_fd(receive_ring_fd(client.sock), attached.ring_name,
                                               expected_layout=layout)
        with pytest.raises(ServerError, match="already attached"):
            client.request(codec.Attach(pid=os.getpid(), policy="red"), codec.Attached)
    with RLlinkClient(address) as client:
        client.ping()
        for policy, slots in (("default", [0, 1, 2]), ("red", [0, 5])):
            attached = client.request(codec.Attach(pid=os.getpid(), policy=policy), codec.Attached)
            ring = StepRing.attach_fd(receive_ring_fd(client.sock), attached.ring_name,
                                      expected_layout=StepLayout.from_json(attached.layout))
            ring.write_batch(slot_records(ring.layout, slots, 30))
            ring.close()
        ready = client.request(codec.SampleReady(env_steps=150, get_state=True), codec.WeightsReady)
        assert set(ready.weights_seq_nos) == {"default", "red"}
        assert ready.weights_seq_no == ready.weights_seq_nos["default"]
        assert ready.weights_seq_nos["red"] >= 1        # trained on (flushed) before the reply
        status = client.status()
    policies = status["policies"]
    assert policies["default"]["env_steps"] == 90 and policies["red"]["env_steps"] == 60
    assert policies["default"]["episodes"] == 3 and policies["red"]["episodes"] == 2
    assert policies["red"]["episode_return_mean"] == 30.0


def test_one_step_batch_serves_agents_of_two_policies(two_policies):
    """A STEP_BATCH whose entries map to two policies: each policy's entries are one group of
    its own (a single group spanning both lane areas would never be complete)."""
    from rlinkd.client_lib.protocol import serving as s
    obs = [0.01, 0.02, 0.03, 0.04]
    client = RawClient(two_policies.listening.port)
    try:
        client.send(codec.Ping())
        assert isinstance(client.recv(), codec.Pong)
        entries = (s.BatchEntry("b0", obs, start=True, agent_id="blue_0"),
                   s.BatchEntry("r0", obs, start=True, agent_id="red_0"),
                   s.BatchEntry("b1", obs, start=True, agent_id="blue_1"))
        client.sock.settimeout(10.0)
        client.send(s.StepBatch(entries))
        reply = client.recv()
        assert isinstance(reply, s.Actions) and all(a in (0, 1) for a in reply.actions)
        client.send(s.StepBatch(tuple(s.BatchEntry(e.episode_id, obs, reward=1.0, terminated=True)
                                      for e in entries)))
        reply = client.recv()
        assert isinstance(reply, s.Actions) and reply.actions == [None, None, None]
    finally:
        client.close()
