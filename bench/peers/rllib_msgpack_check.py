"""RLlib's own msgpack-flavour client side against a running rlinkd: handshake with ray's RLlink
functions, build the RLModule from rlinkd's SET_CONFIG, load SET_STATE (``strict=False``, as
RLlib's client does) and print the module's action logits for the given observations.
Run with the python of a ray >= 2.49 venv (tests/process/test_rllib_msgpack.py does, when
RLINKD_RAY_PYTHON names one):

    VENV/bin/python bench/peers/rllib_msgpack_check.py --port P --obs '[[0.1, 0, 0, 0]]'

Prints one JSON line: ray's version, the weights_seq_no, the module's class, the parameter
names the state did NOT cover (missing) or that the module does not have (unexpected), and
``logits`` (forward_exploration's action_dist_inputs). Imports ray; contains none of its code.
"""
from __future__ import annotations

import argparse
import json
import pickle
import socket

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True, help="rlinkd's TCP port on 127.0.0.1")
    ap.add_argument("--obs", required=True, help="JSON list of observations")
    a = ap.parse_args()
    import ray
    import torch
    from ray.rllib.env.external.rllink import RLlink, get_rllink_message, send_rllink_message
    sock = socket.create_connection(("127.0.0.1", a.port), timeout=60)
    send_rllink_message(sock, {"type": RLlink.PING.name})
    assert get_rllink_message(sock)[0] == RLlink.PONG
    send_rllink_message(sock, {"type": RLlink.GET_CONFIG.name})
    kind, body = get_rllink_message(sock)
    assert kind == RLlink.SET_CONFIG, kind
    config = pickle.loads(body["config"])  # the client trusts its server, as RLlib's does
    module = config.get_rl_module_spec().build()
    send_rllink_message(sock, {"type": RLlink.GET_STATE.name})
    kind, body = get_rllink_message(sock)
    assert kind == RLlink.SET_STATE, kind
    state = body["state"]["rl_module"]
    module.set_state(state)
    own = set(module.state_dict())
    out = module.forward_exploration({"obs": torch.tensor(np.array(json.loads(a.obs), np.float32))})
    print(json.dumps({"ray": ray.__version__, "module": type(module).__name__,
                      "weights_seq_no": body["state"]["weights_seq_no"],
                      "rollout_fragment_length": config.get_rollout_fragment_length(),
                      "missing": sorted(own - set(state)), "unexpected": sorted(set(state) - own),
                      "logits": out["action_dist_inputs"].detach().numpy().tolist()}))
    sock.close()


if __name__ == "__main__":
    main()
