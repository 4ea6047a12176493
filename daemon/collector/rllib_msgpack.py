"""The collector's answers to RLlib's msgpack-flavour clients (ray >= 2.49), in that flavour.

A connection whose first body is a msgpack map speaks this flavour for good
(``flavour_of``); its requests are decoded by ``client_lib.protocol.msgpack_flavour`` into
the same ``codec`` messages JSON clients send and handled by the same ``CollectorCore``
(authentication, episode validation and ingest, on-policy waits). Only the replies differ:
PONG, SET_CONFIG ``{config: <pickled PPOConfig>}`` and SET_STATE ``{state: {rl_module:
{name: array}, weights_seq_no}}`` (``daemon.collector.rllib_module``), ERROR as a msgpack
map. Served: the default policy, when its network has RLlib's default-module form and it is
trained here (a frozen ONNX policy has no weights to rename).
"""
from __future__ import annotations

from rlinkd.client_lib.protocol import codec, msgpack_flavour
from rlinkd.client_lib.protocol.codec import BadMessage, Message
from rlinkd.daemon.collector.core import CollectorCore, Plan, Session
from rlinkd.daemon.collector.rllib_module import config_pickle, rllib_net_error, rllib_state
from rlinkd.daemon.collector.weights import StaticWeights, WeightsCache
from rlinkd.daemon.policies import PolicyDef

JSON, MSGPACK = "json", "msgpack"
PONG = msgpack_flavour.encode({"type": "PONG"})


def flavour_of(first_body: bytes) -> str:
    """A connection's flavour, from its first frame's body."""
    return MSGPACK if msgpack_flavour.is_msgpack(first_body) else JSON


SERVED_ALGORITHMS = ("ppo", "appo")  # an actor whose logits are sampled (not Q-values, not SAC)


class RllibFlavour:
    """Decodes and answers one collector's msgpack connections. ``definition``: the default
    policy; ``cache``: its weights (SET_STATE frames are built once per version; None: only
    decoding and the config, as in the tests' oracle)."""

    def __init__(self, core: CollectorCore, definition: PolicyDef,
                 cache: WeightsCache | None = None) -> None:
        self.core, self.cache, self.spec = core, cache, definition.spec
        self.error = served_error(definition, cache)
        self.config = None if self.error else msgpack_flavour.encode({
            "type": "SET_CONFIG",
            "config": config_pickle(definition.spec, core.cfg.sampling.env_steps_per_sample)})
        self._frame, self._seq = b"", -2

    def decode(self, body: bytes) -> Message:
        return msgpack_flavour.decode_body(body)

    def handle(self, session: Session, msg: Message) -> Plan:
        """The core's plan, with the reply in this flavour (the core checks the token)."""
        if self.config is None and session.authenticated and not isinstance(msg, codec.Ping):
            raise BadMessage(f"{msg.TYPE.value}: no RLlib module for this daemon's network: "
                             f"{self.error}")  # (before the core counts any episode)
        plan = self.core.handle(session, msg)
        if isinstance(msg, codec.Ping):
            plan.reply = PONG
        elif isinstance(msg, codec.GetConfig):
            plan.reply = self.config
        return plan

    def set_state_frame(self) -> bytes:
        """SET_STATE with the cache's current version (the caller refreshed it)."""
        cache = self.cache
        if cache is None or self.config is None:  # (``handle`` refused the request already)
            raise BadMessage(f"SET_STATE: no RLlib module for this daemon's network: {self.error}")
        if cache.seq_no != self._seq:
            state = rllib_state(self.spec, cache.flat)
            self._frame = msgpack_flavour.encode({"type": "SET_STATE", "state": {
                "rl_module": state, "weights_seq_no": cache.seq_no}})
            self._seq = cache.seq_no
        return self._frame

    @staticmethod
    def error_frame(message: str) -> bytes:
        return msgpack_flavour.error_frame(message)


def served_error(definition: PolicyDef, cache: WeightsCache | None) -> str | None:
    """Why the default policy cannot be served to RLlib's clients (None: it can)."""
    if isinstance(cache, StaticWeights):
        return "the default policy is a frozen ONNX model (no weights to send by name)"
    if definition.algorithm not in SERVED_ALGORITHMS:
        return f"RLlib's PPO module serves {'/'.join(SERVED_ALGORITHMS)} policies, not {definition.algorithm}"
    return rllib_net_error(definition.spec)
