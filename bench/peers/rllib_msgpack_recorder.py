"""Record what RLlib's own RLlink client (ray >= 2.49, the msgpack flavour) sends, byte-exact,
and the parameter names and shapes of the RLModule it builds: the fixtures rlinkd's tests replay
(tests/fixtures/rllib_msgpack/ray-<version>/). Run with the python of a ray venv:

    VENV/bin/python bench/peers/rllib_msgpack_recorder.py --out tests/fixtures/rllib_msgpack \\
        --client ../shared/anchors/rllib/rllib_client.py

It serves one client on 127.0.0.1 like RLlib's own server would (PONG, SET_CONFIG with a
pickled PPOConfig, SET_STATE with the module's state), but with a small rollout fragment
(``--fragment``) so that EPISODES_AND_GET_STATE frames stay small, and keeps the first
``--keep`` frames of each message type the client sends. It imports ray (to make RLlib's own
config pickle and module); it contains none of RLlib's code and is never imported by rlinkd.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import pickle
import socket
import subprocess
import sys

HIDDEN = [64, 64]


def build(fragment: int):
    """RLlib's PPO config for CartPole-v1's spaces, fcnet [64, 64] tanh (rlinkd's default
    net), and the torch module that config builds."""
    import gymnasium as gym
    import numpy as np
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    env = gym.make("CartPole-v1")
    config = (PPOConfig()
              .environment(observation_space=env.observation_space,
                           action_space=env.action_space)
              .env_runners(rollout_fragment_length=fragment)
              .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=HIDDEN,
                                                         fcnet_activation="tanh",
                                                         vf_share_layers=False)))
    module = config.get_rl_module_spec().build()
    state = {k: np.asarray(v) for k, v in module.get_state().items()}
    return config, module, state


def read_frame(conn: socket.socket) -> bytes:
    header = _exactly(conn, 8)
    return header + _exactly(conn, int(header))


def _exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("client closed")
        data += chunk
    return data


def send(conn: socket.socket, message: dict) -> None:
    import msgpack
    import msgpack_numpy
    body = msgpack.packb(message, use_bin_type=True, default=msgpack_numpy.encode)
    conn.sendall(b"%08d" % len(body) + body)


def record(conn: socket.socket, out: pathlib.Path, keep: int, fragment: int) -> None:
    """Answer the client and write its frames ``NN-TYPE.bin`` until ``keep`` EPISODES frames."""
    import msgpack
    config, _, state = build(fragment)
    counts: dict[str, int] = {}
    n = 0
    while counts.get("EPISODES_AND_GET_STATE", 0) + counts.get("EPISODES", 0) < keep:
        frame = read_frame(conn)
        kind = msgpack.unpackb(frame[8:], raw=False, ext_hook=_no_ext,
                               object_hook=lambda d: d)["type"]  # (no array decoding needed)
        counts[kind] = counts.get(kind, 0) + 1
        if counts[kind] <= keep:
            (out / f"{n:02d}-{kind}.bin").write_bytes(frame)
            n += 1
        if kind == "PING":
            send(conn, {"type": "PONG"})
        elif kind == "GET_CONFIG":
            send(conn, {"type": "SET_CONFIG", "config": pickle.dumps(config)})
        else:
            send(conn, {"type": "SET_STATE",
                        "state": {"rl_module": state, "weights_seq_no": counts[kind]}})


def _no_ext(code: int, data: bytes):
    raise ValueError(f"extension type {code}")


def module_names(out: pathlib.Path, fragment: int) -> None:
    """The module's parameter names and shapes (what rlinkd's SET_STATE must match)."""
    import ray
    config, module, _ = build(fragment)
    params = {k: list(v.shape) for k, v in module.state_dict().items()}
    inference = config.get_rl_module_spec(inference_only=True).build()
    (out / "module.json").write_text(json.dumps({
        "ray": ray.__version__, "module": type(module).__name__, "fcnet_hiddens": HIDDEN,
        "fcnet_activation": "tanh", "params": params,
        "inference_only_params": sorted(inference.state_dict())}, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder; ray-<version>/ is made in it")
    ap.add_argument("--client", required=True, help="rllib_client.py (RLlib's dummy client)")
    ap.add_argument("--keep", type=int, default=3, help="frames kept per message type")
    ap.add_argument("--fragment", type=int, default=32, help="rollout_fragment_length")
    a = ap.parse_args()
    import ray
    out = pathlib.Path(a.out) / f"ray-{ray.__version__}"
    out.mkdir(parents=True, exist_ok=True)
    module_names(out, a.fragment)
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        client = subprocess.Popen([sys.executable, a.client, "--host", "127.0.0.1", "--port",
                                   str(port), "--stop-return", "0", "--max-seconds", "120"])
        conn, _ = srv.accept()
        try:
            record(conn, out, a.keep, a.fragment)
        finally:
            conn.close()
            client.wait(timeout=60)
    print(json.dumps({"recorded": sorted(p.name for p in out.iterdir())}))


if __name__ == "__main__":
    main()
