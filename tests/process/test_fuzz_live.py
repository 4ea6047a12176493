"""Live-server fuzzers: hostile bytes against a real daemon's TCP port and Unix socket.

Every case is one connection: the payload is sent, the write side is shut (so an
incomplete frame ends in EOF), and everything the server sends is read until it
closes. What the server must answer is computed by a local oracle — the collector's
own protocol core (``CollectorCore`` + ``FrameDecoder``) on the same config — and the
live replies must match it exactly (reply types in order; ERROR messages word for
word). A crash in the server's connection handler shows up as a missing ERROR; a hang
as a connection that never closes.

Meanwhile well-behaved clients (TCP and Unix socket) do PING / GET_CONFIG /
EPISODES_AND_GET_STATE round trips in threads and must never see an error. The last
test checks the daemon afterwards: alive, no child restarted, ``protocol_errors``
grew by exactly the number of ERROR replies the oracle predicted, RSS bounded, no
traceback in its log, and at least 10,000 cases ran.
"""
from __future__ import annotations

import json
import os
import random
import select
import selectors
import socket
import threading
import time
from pathlib import Path
from dataclasses import dataclass, field

import numpy as np
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlinkd.client_lib.protocol import codec, msgpack_flavour
from rlinkd.client_lib.transport import RLlinkClient
from rlinkd.client_lib.protocol.compact import encode_compact
from rlinkd.client_lib.protocol.agents import DEFAULT_POLICY
from rlinkd.daemon.collector.core import CollectorCore, policy_info
from rlinkd.daemon.collector.rllib_msgpack import MSGPACK, RllibFlavour, flavour_of
from rlinkd.daemon.policies import policy_defs
from rlinkd.daemon.config import load_config
from tests.helpers import DaemonProcess, raw_connect, raw_recv, raw_send, wait_for
from tests.unit.test_msgpack_flavour import HOSTILE as HOSTILE_MSGPACK

pytestmark = pytest.mark.process

MIN_TOTAL_CASES = 10_000
MAX_RSS_GROWTH_BYTES = 100 * 1024 * 1024
FAMILIES = ("random_bytes", "mutated_frames", "truncated_frames", "hostile_episodes",
            "nesting_and_headers", "huge_arrays", "slow_clients", "composite_episodes",
            "agent_episodes", "serving", "direct_serving", "msgpack_frames",
            "recurrent_episodes")


def fuzz_settings(examples: int):
    # database=None: nothing written to the work tree; failures print a reproduction blob
    return settings(max_examples=examples, deadline=None, database=None, print_blob=True,
                    suppress_health_check=list(HealthCheck))


# ---------------------------------------------------------------- the oracle
class Oracle:
    """The collector's protocol core on the daemon's config: the replies a payload must get."""

    def __init__(self, *overrides: tuple[str, str, object], path=None) -> None:
        cfg = load_config(path, overrides=list(overrides), resolve_dirs=False)
        self.max_bytes = cfg.server.max_message_bytes
        defs = policy_defs(cfg)
        self.core = CollectorCore(cfg, {name: policy_info(d) for name, d in defs.items()})
        self.rllib = RllibFlavour(self.core, defs[DEFAULT_POLICY])  # msgpack connections

    def replies(self, payload: bytes, transport: str) -> list[tuple[str, str]]:
        """[(type, ERROR message or "")] the server must send for ``payload`` then EOF."""
        decoder = codec.FrameDecoder(self.max_bytes)
        decoder.feed(payload)
        session = self.core.open_session("oracle", transport)
        out: list[tuple[str, str]] = []
        first = True
        try:
            while (body := decoder.next_body()) is not None:
                if first:
                    session.flavour, first = flavour_of(body), False
                if session.flavour == MSGPACK:
                    plan = self.rllib.handle(session, self.rllib.decode(body))
                else:
                    plan = self.core.handle(session, codec.decode_body(body))
                if plan.reply is not None:
                    out.append((reply_kind(plan.reply[codec.HEADER_BYTES:])[0], ""))
                if plan.status:
                    out.append(("STATUS_REPORT", ""))
                if plan.attach is not None:
                    out.append(("ATTACHED", ""))
                if plan.shm_sample is not None:
                    out.append(("WEIGHTS_READY", ""))
                if plan.newest_state or plan.wait_for_training:
                    out.append(("SET_STATE", ""))
        except codec.ProtocolError as exc:
            out.append(("ERROR", str(exc)[:1000]))
        finally:
            self.core.close_session(session)
        return out


def reply_kind(body: bytes) -> tuple[str, str]:
    """(type, ERROR message or "") of one server frame body, in either flavour."""
    if msgpack_flavour.is_msgpack(body):
        msg = msgpack_flavour.unpack(body)
        return msg["type"], msg.get("message", "") if msg["type"] == "ERROR" else ""
    parsed = codec.decode_body(body)
    return parsed.TYPE.value, parsed.message if isinstance(parsed, codec.Error) else ""


def parse_replies(data: bytes) -> tuple[list[tuple[str, str]], bool]:
    """Decode the server's frames; also whether the bytes ended exactly on a frame boundary."""
    out, pos = [], 0
    while pos + codec.HEADER_BYTES <= len(data):
        size = codec.parse_header(data[pos:pos + codec.HEADER_BYTES], 1 << 30)
        end = pos + codec.HEADER_BYTES + size
        if end > len(data):
            break
        kind = reply_kind(data[pos + codec.HEADER_BYTES:end])
        out.append(kind)
        pos = end
        if kind[0] == "ATTACHED" and data[pos:pos + 1] == codec.RING_FD_BYTE:
            pos += 1  # the byte that carries the ring's memfd (SCM_RIGHTS) follows ATTACHED
    return out, pos == len(data)


# ---------------------------------------------------------------- many connections at once
@dataclass
class Conn:
    sock: socket.socket
    payload: memoryview
    sent: int = 0
    data: bytearray = field(default_factory=bytearray)
    reset: bool = False
    done: bool = False


def open_socket(daemon: DaemonProcess, transport: str) -> socket.socket:
    if transport == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(daemon.unix_socket)
    else:
        sock = socket.create_connection(("127.0.0.1", daemon.port), timeout=10)
    sock.setblocking(False)
    return sock


def exchange(daemon: DaemonProcess, cases: list[tuple[str, bytes]],
             timeout_s: float = 60.0) -> list[Conn]:
    """One connection per (transport, payload): send, shut the write side, read to EOF."""
    sel = selectors.DefaultSelector()
    conns = []
    for transport, payload in cases:
        conn = Conn(open_socket(daemon, transport), memoryview(payload))
        conns.append(conn)
        sel.register(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
    deadline = time.monotonic() + timeout_s
    pending = len(conns)
    try:
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                stuck = [bytes(c.payload[:200]) for c in conns if not c.done]
                raise AssertionError(f"{len(stuck)} connections not closed by the server within "
                                     f"{timeout_s} s; first payloads: {stuck[:3]}")
            for key, events in sel.select(remaining):
                conn = key.data
                if events & selectors.EVENT_WRITE and conn.sent < len(conn.payload):
                    _send_some(conn)
                    if conn.sent >= len(conn.payload) or conn.reset:
                        _half_close(conn)
                        sel.modify(conn.sock, selectors.EVENT_READ, conn)
                elif events & selectors.EVENT_WRITE:  # empty payload
                    _half_close(conn)
                    sel.modify(conn.sock, selectors.EVENT_READ, conn)
                if events & selectors.EVENT_READ and not conn.done:
                    _recv_some(conn)
                    if conn.done:
                        sel.unregister(conn.sock)
                        pending -= 1
    finally:
        for conn in conns:
            conn.sock.close()
        sel.close()
    return conns


def _send_some(conn: Conn) -> None:
    try:
        conn.sent += conn.sock.send(conn.payload[conn.sent:conn.sent + 262144])
    except BlockingIOError:
        pass
    except (BrokenPipeError, ConnectionResetError):
        conn.reset = True  # the server closed after an ERROR while we were still sending


def _half_close(conn: Conn) -> None:
    try:
        conn.sock.shutdown(socket.SHUT_WR)
    except OSError:
        conn.reset = True


def _recv_some(conn: Conn) -> None:
    try:
        chunk = conn.sock.recv(1 << 20)
    except BlockingIOError:
        return
    except ConnectionResetError:
        conn.reset, conn.done = True, True
        return
    if chunk:
        conn.data += chunk
    else:
        conn.done = True


# ---------------------------------------------------------------- well-behaved clients
def valid_fragment(rng: random.Random, steps: int = 8) -> codec.EpisodeFragment:
    obs = np.array([[rng.uniform(-0.1, 0.1) for _ in range(4)] for _ in range(steps + 1)])
    return codec.EpisodeFragment(obs=obs, actions=np.array([rng.randrange(2) for _ in range(steps)]),
                                 rewards=np.ones(steps), is_terminated=True, is_truncated=False)


ROUND_PAUSE_S = 0.05
"""Between a valid client's round trips: ~20 a second show the daemon serving while it is
fuzzed; back to back they would keep the learner training all the time, for nothing."""


class ValidClient(threading.Thread):
    """PING / GET_CONFIG / (EPISODES_AND_GET_STATE | GET_STATE) round trips until stopped,
    ``ROUND_PAUSE_S`` apart."""

    def __init__(self, address: str, episodes: bool = True, seed: int = 0) -> None:
        super().__init__(daemon=True)
        self.address, self.episodes, self.rng = address, episodes, random.Random(seed)
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.rounds = 0
        self.max_round_s = 0.0

    def run(self) -> None:
        try:
            with RLlinkClient(self.address, timeout_s=60.0) as client:
                while not self.stop_event.is_set():
                    start = time.monotonic()
                    client.ping()
                    config = client.get_config()
                    assert config.observation_space["shape"] == [4], config
                    if self.episodes:
                        state = client.episodes_and_get_state([valid_fragment(self.rng)])
                    else:
                        state = client.get_state()
                    assert state.weights_seq_no >= 0 and state.onnx_file, state.weights_seq_no
                    self.max_round_s = max(self.max_round_s, time.monotonic() - start)
                    self.rounds += 1
                    self.stop_event.wait(ROUND_PAUSE_S)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def finish(self) -> None:
        self.stop_event.set()
        self.join(60)
        assert not self.is_alive(), f"valid client {self.address} did not stop"
        assert self.error is None, f"valid client {self.address} saw {self.error!r}"


def process_rss(daemon: DaemonProcess) -> dict[str, int]:
    """RSS of the supervisor and of each child role, by name."""
    children = daemon.status()["children"]
    pids = {"supervisor": daemon.pid, **{role: c["pid"] for role, c in children.items()}}
    return {name: psutil.Process(pid).memory_info().rss for name, pid in pids.items()}


# ---------------------------------------------------------------- module state
@dataclass
class Tally:
    started: float = field(default_factory=time.monotonic)
    cases: int = 0
    families: dict = field(default_factory=dict)


TALLY = Tally()


def count_cases(family: str, n: int) -> None:
    TALLY.cases += n
    TALLY.families[family] = TALLY.families.get(family, 0) + n


@dataclass
class FuzzTarget:
    """A daemon under fuzz, its oracle, and what was seen before fuzzing started."""

    daemon: DaemonProcess
    oracle: Oracle
    expected_errors: int = 0          # ERROR replies the oracle predicted so far
    clients: list = field(default_factory=list)
    errors_before: int = 0
    expected_direct_errors: int = 0   # ERRORs on connections handed to the inference role
    direct_errors_before: int = 0
    rss_before: dict = field(default_factory=dict)
    pids_before: dict = field(default_factory=dict)

    def run(self, family: str, payloads: list[bytes], transports: list[str] | None = None,
            timeout_s: float = 60.0) -> list[list[tuple[str, str]]]:
        """Run cases (alternating TCP / Unix unless given), check each against the oracle."""
        transports = transports or [("tcp", "unix")[i % 2] for i in range(len(payloads))]
        expected = [self.oracle.replies(p, t) for p, t in zip(payloads, transports)]
        conns = exchange(self.daemon, list(zip(transports, payloads)), timeout_s)
        for payload, want, conn in zip(payloads, expected, conns):
            got, whole = parse_replies(bytes(conn.data))
            context = f"payload {payload[:300]!r} ({len(payload)} bytes)"
            if conn.reset:  # the server closed with our bytes unread: only after an ERROR
                assert want and want[-1][0] == "ERROR", f"reset without ERROR expected: {context}"
                assert got == want[:len(got)], f"{context}: got {got}, expected {want}"
            else:
                assert whole, f"{context}: reply ends in a partial frame: {bytes(conn.data)[-200:]!r}"
                assert got == want, f"{context}: got {got}, expected {want}"
        self.expected_errors += sum(1 for w in expected if w and w[-1][0] == "ERROR")
        count_cases(family, len(payloads))
        return expected


@pytest.fixture(scope="module")
def target(shared_daemon):
    """The shared daemon under fuzz, with two valid clients running the whole time."""
    clients = [ValidClient(f"tcp://127.0.0.1:{shared_daemon.port}", seed=1),
               ValidClient(f"unix://{shared_daemon.unix_socket}", seed=2)]
    for client in clients:
        client.start()
    wait_for(lambda: all(c.rounds >= 2 or c.error for c in clients), 120, 0.05,
             "valid clients' first round trips")
    status = shared_daemon.status()
    yield FuzzTarget(shared_daemon, Oracle(), clients=clients,
                     errors_before=status["protocol_errors"],
                     direct_errors_before=status["inference"].get("direct_errors", 0),
                     rss_before=process_rss(shared_daemon),
                     pids_before={r: c["pid"] for r, c in status["children"].items()})
    for client in clients:
        client.stop_event.set()
    for client in clients:
        client.join(60)


# ---------------------------------------------------------------- generators
# Hypothesis draws the structure (valid messages, hostile messages, nesting) and a seed;
# a seeded ``random.Random`` expands each example into CASES cheap variants (byte
# mutations, JSON-tree mutations, cut points): drawing every case through Hypothesis
# costs milliseconds each, too slow for 10,000 cases in CI.
CASES = 40
seeds = st.integers(0, 2**32 - 1)


def frame(body: bytes | str | dict) -> bytes:
    if isinstance(body, dict):
        body = json.dumps(body, allow_nan=True)  # NaN/Infinity literals reach the server
    if isinstance(body, str):
        body = body.encode()
    return b"%08d" % len(body) + body


finite = st.floats(-0.25, 0.25, allow_nan=False, width=32)


@st.composite
def valid_episode(draw) -> dict:
    steps = draw(st.integers(0, 4))
    ending = draw(st.sampled_from(["terminated", "truncated", "cut"]))
    episode = {"obs": [[draw(finite) for _ in range(4)] for _ in range(steps + 1)],
               "actions": [draw(st.integers(0, 1)) for _ in range(steps)],
               "rewards": [draw(finite) for _ in range(steps)],
               "is_terminated": ending == "terminated", "is_truncated": ending == "truncated"}
    if steps and draw(st.booleans()):
        episode["action_logp"] = [draw(finite) for _ in range(steps)]
    if steps and draw(st.booleans()):  # (an empty [] is not accepted as a [0, 2] array)
        episode["action_dist_inputs"] = [[draw(finite), draw(finite)] for _ in range(steps)]
    return episode


@st.composite
def valid_message(draw) -> dict:
    kind = draw(st.sampled_from(["PING", "PING", "GET_CONFIG", "GET_STATE", "STATUS",
                                 "EPISODES", "EPISODES", "EPISODES_AND_GET_STATE", "ATTACH",
                                 "SAMPLE_READY"]))
    if kind == "ATTACH":  # the shared-memory extension (Unix socket only)
        return {"type": kind, "pid": os.getpid(), "capacity_records": draw(st.sampled_from(
            [None, 0, 1024, 5000]))}
    if kind == "SAMPLE_READY":
        return {"type": kind, "env_steps": 0, "get_state": draw(st.booleans())}
    if not kind.startswith("EPISODES"):
        return {"type": kind}
    episodes = draw(st.lists(valid_episode(), min_size=1, max_size=2))
    msg = {"type": kind, "episodes": episodes}
    if draw(st.booleans()):
        msg["env_steps" if draw(st.booleans()) else "timesteps"] = sum(
            len(e["actions"]) for e in episodes)
    return msg


valid_stream = st.lists(valid_message(), min_size=1, max_size=3).map(
    lambda msgs: b"".join(frame(m) for m in msgs))

SIMPLE_REQUESTS = [frame({"type": t}) for t in ("PING", "GET_CONFIG", "GET_STATE", "STATUS")]
JSONISH = b'{}[]":,0123456789 \n\t-.eEtruefalsnul\\'


def random_bytes_case(rng: random.Random) -> bytes:
    kind = rng.randrange(5)
    if kind == 0:
        return rng.randbytes(rng.randint(0, 300))
    if kind == 1:  # a well-formed header, random body
        body = rng.randbytes(rng.randint(0, 300))
        return b"%08d" % len(body) + body
    if kind == 2:  # a header that is almost digits
        return b"000000" + rng.randbytes(rng.randint(1, 60))
    if kind == 3:  # any 8-digit length, a few bytes
        return b"%08d" % rng.randint(0, 99_999_999) + rng.randbytes(rng.randint(0, 40))
    body = bytes(rng.choice(JSONISH) for _ in range(rng.randint(0, 200)))
    return b"%08d" % len(body) + body


def mutate_bytes(rng: random.Random, blob: bytes) -> bytes:
    """1-3 of: bit flips, odd bytes, truncation, insertion, deletion, a wrong header length."""
    b = bytearray(blob)
    for _ in range(rng.randint(1, 3)):
        op = rng.choice(("flip", "flip", "byte", "truncate", "insert", "delete", "header",
                         "repeat"))
        pos = rng.randrange(len(b)) if b else 0
        if op == "flip" and b:
            b[pos] ^= 1 << rng.randrange(8)
        elif op == "byte" and b:
            b[pos] = rng.choice(JSONISH + b"\x00\xff\x80")
        elif op == "truncate":
            del b[pos:]
        elif op == "insert":
            b[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif op == "delete":
            del b[pos:pos + rng.randint(1, 8)]
        elif op == "repeat":
            b[pos:pos] = b[pos:pos + rng.randint(1, 16)]
        elif op == "header" and len(b) >= 8:  # a wrong length in the first header
            size = int(b[:8]) if bytes(b[:8]).isdigit() else 0
            b[:8] = b"%08d" % max(0, min(99_999_999, size + rng.randint(-20, 20)))
    return bytes(b)


# ---------------------------------------------------------------- hostile JSON
PALETTE = [None, True, False, 0, 1, -1, 2, 7, 0.5, -0.0, 1e39, -1e39, 1e308, float("nan"),
           float("inf"), float("-inf"), 2**63, 2**64 - 1, -2**63 - 1, 2**70, "", "1", "PING",
           "EPISODES", "\u0000", "\ud7ff\u00e9", [], {}, [[]], [0] * 5, [[0.0] * 4] * 3,
           [[0.0] * 3] * 2, [[[0.0] * 4]] * 2, [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0]], [True, False],
           ["a", "b"], [None], {"type": "PING"}, [[1e39] * 4] * 2, [[0.0] * 4] * 2,
           [0.1] * 3, [[0.1, 0.2]] * 2, [[[[[[[[0]]]]]]]]]
EXTRA_KEYS = ("extra", "env_steps", "timesteps", "weights_seq_no", "token", "action_logp",
              "action_dist_inputs", "episodes", "obs", "type")


def _slots(node, acc: list) -> list:
    """Every (container, key) in a JSON tree, depth first."""
    if isinstance(node, dict):
        for key in list(node):
            acc.append((node, key))
            _slots(node[key], acc)
    elif isinstance(node, list):
        for i in range(len(node)):
            acc.append((node, i))
            _slots(node[i], acc)
    return acc


def mutate_json(rng: random.Random, msg: dict) -> dict:
    """1-3 structural edits anywhere in a message: replace, delete, wrap, unwrap, duplicate,
    retype, scale a number, add a key."""
    msg = json.loads(json.dumps(msg, allow_nan=True))  # a private deep copy
    for _ in range(rng.randint(1, 3)):
        slots = _slots(msg, [])
        if not slots:
            break
        parent, key = rng.choice(slots)
        value = parent[key]
        op = rng.randrange(8)
        if op == 0:
            parent[key] = json.loads(json.dumps(rng.choice(PALETTE), allow_nan=True))
        elif op == 1 and parent is not msg:
            del parent[key]
        elif op == 2:
            parent[key] = [value]
        elif op == 3 and isinstance(value, list):
            parent[key] = value[0] if value else None
        elif op == 4 and isinstance(parent, list):
            parent.insert(key, json.loads(json.dumps(value, allow_nan=True)))
        elif op == 5:
            parent[key] = str(value)[:24]
        elif op == 6 and isinstance(value, (int, float)) and not isinstance(value, bool):
            parent[key] = value * rng.choice((-1, 10, 1e30, 1e300, 0.5)) + rng.choice((0, 1))
        else:
            target_dict = parent if isinstance(parent, dict) else msg
            target_dict[rng.choice(EXTRA_KEYS)] = json.loads(json.dumps(rng.choice(PALETTE),
                                                                        allow_nan=True))
    return msg


json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4))
json_value = st.recursive(json_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=3), inner, max_size=3)),
    max_leaves=8)
numberish = st.one_of(st.integers(-3, 3), st.floats(-1e3, 1e3), st.sampled_from(
    [0.5, -0.0, 1e39, 1e308, 2**63, 2**64 - 1, -2**63, True, None, "1", float("nan")]))


@st.composite
def shaped_array(draw):
    """Nested lists of a random shape, one fill value, and a few odd leaves or rows
    (ragged, foreign types). Cheap to draw: a handful of choices whatever the size."""
    shape = draw(st.lists(st.integers(0, 5), max_size=3))
    fill = draw(numberish)
    def build(dims):
        return fill if not dims else [build(dims[1:]) for _ in range(dims[0])]
    array = build(shape)
    for _ in range(draw(st.integers(0, 2))):
        node, depth = array, draw(st.integers(0, max(0, len(shape) - 1)))
        for _ in range(depth):
            if not isinstance(node, list) or not node or not isinstance(node[0], list):
                break
            node = node[draw(st.integers(0, len(node) - 1))]
        if isinstance(node, list) and node:
            node[draw(st.integers(0, len(node) - 1))] = draw(st.one_of(numberish, json_value))
    return array


@st.composite
def hostile_episode(draw) -> dict:
    """A valid episode with 1-3 fields replaced by odd shapes or types, or dropped."""
    episode = draw(valid_episode())
    for key in draw(st.lists(st.sampled_from([*sorted(episode), "action_logp",
                                                               "action_dist_inputs", "extra"]),
                             min_size=1, max_size=3, unique=True)):
        how = draw(st.sampled_from(["array", "array", "value", "drop"]))
        if how == "drop":
            episode.pop(key, None)
        else:
            episode[key] = draw(shaped_array()) if how == "array" else draw(json_value)
    return episode


@st.composite
def hostile_message(draw) -> dict:
    msg = {"type": draw(st.sampled_from(["EPISODES", "EPISODES_AND_GET_STATE"]))}
    episodes = draw(st.lists(st.one_of(hostile_episode(), valid_episode()), max_size=3))
    msg["episodes"] = draw(st.one_of(st.just(episodes), st.just(episodes), json_value))
    if draw(st.booleans()):
        msg[draw(st.sampled_from(["env_steps", "timesteps"]))] = draw(st.one_of(
            st.integers(-1, 12), json_value))
    if draw(st.booleans()):
        msg["weights_seq_no"] = draw(st.one_of(st.integers(-2**64, 2**64), json_value))
    return msg


# ---------------------------------------------------------------- nesting and headers
def nested(depth: int, inner: str = "1", opener: str = "[", closer: str = "]") -> str:
    return opener * depth + inner + closer * depth


NESTING_CASES = [
    frame("[" * 100_000),                                   # 100k unclosed levels
    frame(nested(100_000)),                                 # 100k balanced levels
    frame('{"a":' * 100_000 + "1" + "}" * 100_000),         # 100k object levels
    ("[" * 100_000).encode(),                               # unframed: a bad header
    frame('{"type": "PING", "x": ' + nested(1000) + "}"),  # within orjson's limit: PONG
    frame('{"type": "PING", "x": ' + nested(1100) + "}"),  # beyond it: ERROR
    frame('{"type": ' + nested(1020) + "}"),
    frame('{"type": ' + nested(1000, "{}", "{\"a\":", "}") + "}"),
    frame('{"type": "EPISODES", "episodes": [], "env_steps": ' + nested(1000) + "}"),
    frame('{"type": "EPISODES", "episodes": ' + nested(1020) + "}"),
    frame('{"type": "PING", "token": ' + nested(1000) + "}"),
    frame('{"type": "EPISODES", "episodes": [{"obs": ' + nested(1000) +
          ', "actions": [], "rewards": [], "is_terminated": true, "is_truncated": false}]}'),
    frame('{"type": "EPISODES", "episodes": [{"obs": [[0,0,0,0]], "actions": ' + nested(60) +
          ', "rewards": [], "is_terminated": true, "is_truncated": false}]}'),
]
HEADER_CASES = [
    b"99999999", b"99999999" + b"{" * 1000, b"67108865{}", b"00000000", b"00000000" * 3,
    b"-0000001{}", b"+0000016{\"type\": \"PING\"}", b" 0000016{\"type\": \"PING\"}",
    b"0000016 {\"type\": \"PING\"}", b"0x000010{\"type\": \"PING\"}",
    "０００００１６".encode()[:8] + b'{"type": "PING"}', b"1e+00016" + b"x" * 16,
    b"00000016", b"0000", b"\x00" * 8, b"\xff" * 64,
    frame({"type": "PING"}) + b"99999999",
    frame({"type": "PING"}) * 50 + frame({"type": "GET_CONFIG"}) + b"99999998",
]


@st.composite
def nesting_or_header(draw) -> bytes:
    depth = draw(st.integers(1, 1100))
    where = draw(st.sampled_from(["type", "x", "token", "env_steps", "episodes", "obs"]))
    open_, close = draw(st.sampled_from([("[", "]"), ('{"k":', "}")]))
    inner = nested(depth, "0", open_, close)
    if where == "obs":
        return frame('{"type": "EPISODES", "episodes": [{"obs": ' + inner + ', "actions": [],'
                     ' "rewards": [], "is_terminated": false, "is_truncated": true}]}')
    kind = "EPISODES" if where in ("env_steps", "episodes") else "PING"
    extra = ', "episodes": []' if where == "env_steps" else ""
    body = '{"type": ' + (inner if where == "type" else f'"{kind}"') + extra
    return frame(body + (f', "{where}": {inner}' if where != "type" else "") + "}")


# ---------------------------------------------------------------- the shared daemon's fuzzers
@fuzz_settings(70)
@given(seed=seeds, blob=st.binary(max_size=300))
def test_random_bytes(target, seed, blob):
    rng = random.Random(seed)
    target.run("random_bytes", [blob] + [random_bytes_case(rng) for _ in range(CASES - 1)])


@fuzz_settings(90)
@given(seed=seeds, stream=valid_stream)
def test_mutated_valid_frames(target, seed, stream):
    rng = random.Random(seed)
    target.run("mutated_frames", [mutate_bytes(rng, stream) for _ in range(CASES)])


@fuzz_settings(25)
@given(seed=seeds, prefix=st.lists(valid_message(), max_size=2), last=valid_message())
def test_truncated_frames_then_close(target, seed, prefix, last):
    rng = random.Random(seed)
    head, cut = b"".join(frame(m) for m in prefix), frame(last)
    payloads = [head + cut[:rng.randrange(len(cut))] for _ in range(CASES)]
    expected = target.run("truncated_frames", payloads)
    # a frame cut short is never answered (the server just closes): the replies are
    # those of the whole frames before it
    for i, want in enumerate(expected):
        assert want == target.oracle.replies(head, ("tcp", "unix")[i % 2]), (payloads[i], want)


@fuzz_settings(75)
@given(seed=seeds, msg=hostile_message())
def test_wrong_dtypes_and_shapes_in_episodes(target, seed, msg):
    rng = random.Random(seed)
    payloads = [frame(msg)] + [frame(mutate_json(rng, msg)) for _ in range(CASES - 1)]
    # a quarter of the connections start with a valid request (valid, then invalid)
    payloads = [(rng.choice(SIMPLE_REQUESTS) if rng.random() < 0.25 else b"") + p
                for p in payloads]
    target.run("hostile_episodes", payloads)


def test_deep_nesting_and_giant_headers(target):
    cases = NESTING_CASES + HEADER_CASES
    expected = target.run("nesting_and_headers", cases, ["tcp"] * len(cases))
    assert target.run("nesting_and_headers", cases, ["unix"] * len(cases)) == expected
    assert expected[0][-1][0] == "ERROR" and "depth limit" in expected[0][-1][1]
    assert expected[4] == [("PONG", "")] and expected[5][0][0] == "ERROR"
    giant = expected[len(NESTING_CASES)]  # b"99999999": refused before any body byte
    assert giant == [("ERROR", "frame of 99999999 bytes exceeds max_message_bytes=67108864")]


@fuzz_settings(10)
@given(st.lists(nesting_or_header(), min_size=20, max_size=20))
def test_random_nesting_depths(target, payloads):
    target.run("nesting_and_headers", payloads)


# ---------------------------------------------------------------- RLlib's msgpack flavour
RECORDED_MSGPACK = [[p.read_bytes() for p in sorted(d.glob("*.bin"))] for d in sorted(
    (Path(__file__).resolve().parents[1] / "fixtures" / "rllib_msgpack").glob("ray-*"))]


def msgpack_case(rng: random.Random) -> bytes:
    """A connection of RLlib's msgpack client (frames recorded from ray 2.49/2.60), mutated:
    a recorded prefix then one mutated frame, a hostile body, the whole recording mutated,
    or a JSON frame on a msgpack connection."""
    frames, kind = rng.choice(RECORDED_MSGPACK), rng.randrange(4)
    if kind == 0:
        n = rng.randrange(len(frames))
        return b"".join(frames[:n]) + mutate_bytes(rng, frames[n])
    if kind == 1:
        body = rng.choice(list(HOSTILE_MSGPACK.values()))
        return (frames[0] if rng.random() < 0.5 else b"") + b"%08d" % len(body) + body
    if kind == 2:
        return mutate_bytes(rng, b"".join(frames))
    return frames[0] + rng.choice(SIMPLE_REQUESTS)


@fuzz_settings(25)
@given(seed=seeds)
def test_rllib_msgpack_frames(target, seed):
    rng = random.Random(seed)
    target.run("msgpack_frames", [msgpack_case(rng) for _ in range(CASES)])


def _episodes(kind: str = "EPISODES", **changes) -> dict:
    episode = {"obs": [[0.0, 0.0, 0.0, 0.0], [0.01, 0.0, 0.0, 0.0]], "actions": [1],
               "rewards": [1.0], "is_terminated": True, "is_truncated": False}
    return {"type": kind, "episodes": [dict(episode, **changes)]}


# Bugs these fuzzers found, replayed deterministically: (payload, the exact replies).
REGRESSIONS = {
    # repr() of a deeply nested "type" overflowed the stack: no ERROR, an unhandled
    # exception in the connection task, not counted
    "nested type": (frame('{"type": ' + nested(1000) + "}"),
                    [("ERROR", "unknown message type <JSON array>")]),
    "nested env_steps": (
        frame('{"type": "EPISODES", "episodes": [], "env_steps": ' + nested(1000) + "}"),
        [("ERROR", "EPISODES: env_steps/timesteps says <JSON array> but the episodes hold "
                   "0 steps")]),
    # weights_seq_no >= 2**63 overflowed the int64 record field (OverflowError, no ERROR)
    "weights_seq_no 2**63": (frame(dict(_episodes(), weights_seq_no=2**63)),
                             [("ERROR", "EPISODES: weights_seq_no 9223372036854775808 does "
                                        "not fit 64 bits")]),
    # finite in float64 but inf as float32 (CartPole's velocity dims are unbounded): the
    # learner rejected the batch, and its on-policy clients waited for nothing
    "obs beyond float32": (frame(_episodes(obs=[[0.0, 1e39, 0.0, 0.0], [0.0] * 4])),
                           [("ERROR", "episodes[0].obs: values beyond the float32 range")]),
    "reward beyond float32": (frame(_episodes(rewards=[-1e39])),
                              [("ERROR", "episodes[0].rewards: values beyond the float32 "
                                         "range")]),
    "logp beyond float32": (frame(_episodes(action_logp=[1e300])),
                            [("ERROR", "episodes[0].action_logp: values beyond the float32 "
                                       "range")]),
    # on-policy EPISODES_AND_GET_STATE with no episodes waited forever (nothing to train)
    "empty sample": (frame({"type": "EPISODES_AND_GET_STATE", "episodes": []}),
                     [("SET_STATE", "")]),
}


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_regressions_found_by_fuzzing(target, name):
    payload, replies = REGRESSIONS[name]
    assert target.oracle.replies(payload, "tcp") == replies
    target.run("regressions", [payload, payload], timeout_s=20)  # TCP and Unix socket



# ---------------------------------------------------------------- dedicated daemons
def weights_are_finite(state: dict) -> bool:
    """Every initializer of the ONNX model a SET_STATE carries (base64 of gzip) is finite."""
    import base64
    import gzip

    import onnx
    from onnx import numpy_helper
    model = onnx.load_from_string(gzip.decompress(base64.b64decode(state["onnx_file"])))
    return all(np.isfinite(numpy_helper.to_array(t)).all() for t in model.graph.initializer)


def test_extreme_finite_values_do_not_poison_the_weights(daemon_factory):
    daemon = daemon_factory()
    sock = raw_connect(daemon.port)
    for poison in (dict(action_logp=[-1e4]), dict(rewards=[3e38]), {}):
        raw_send(sock, _episodes("EPISODES_AND_GET_STATE", **poison))
        state = raw_recv(sock)
        assert state["type"] == "SET_STATE" and weights_are_finite(state), (poison, state["weights_seq_no"])
    sock.close()


def dribble(daemon: DaemonProcess, transport: str, payload: bytes, burst: int,
            rng: random.Random) -> tuple[float, bytes]:
    """Send ``burst`` bytes, then one byte every 0.2-1 s; return (seconds from the first
    byte until the server closed, what it sent)."""
    sock = open_socket(daemon, transport)
    sock.setblocking(True)
    received, start = b"", time.monotonic()
    try:
        chunks = [payload[:burst]] + [payload[i:i + 1] for i in range(burst, len(payload))]
        for chunk in chunks:
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - start, received
            deadline = time.monotonic() + rng.uniform(0.2, 1.0)
            while (left := deadline - time.monotonic()) > 0:  # by design: slow on purpose
                if select.select([sock], [], [], left)[0]:
                    try:
                        data = sock.recv(65536)
                    except ConnectionResetError:
                        data = b""
                    if not data:
                        return time.monotonic() - start, received
                    received += data
        raise AssertionError(f"the server read a whole slow frame ({len(payload)} bytes over "
                             f"{time.monotonic() - start:.1f} s) without closing")
    finally:
        sock.close()


def test_slow_clients_are_dropped_after_read_timeout(daemon_factory):
    read_timeout_s = 2.0
    daemon = daemon_factory("--set", f"server.read_timeout_s={read_timeout_s}")
    others = [ValidClient(f"tcp://127.0.0.1:{daemon.port}", episodes=False),
              ValidClient(f"unix://{daemon.unix_socket}", episodes=False)]
    for client in others:
        client.start()
    wait_for(lambda: all(c.rounds >= 2 or c.error for c in others), 60, 0.05, "valid clients")
    ping, episodes = frame({"type": "PING"}), frame({"type": "EPISODES", "episodes": [
        {"obs": [[0.0] * 4] * 3, "actions": [0, 1], "rewards": [1.0, 1.0],
         "is_terminated": True, "is_truncated": False}]})
    slow = [("tcp", ping, 0), ("unix", ping, 0), ("tcp", episodes, 8), ("unix", episodes, 12)]
    results: list = [None] * len(slow)
    def run(i: int) -> None:
        results[i] = dribble(daemon, *slow[i], random.Random(i))
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(slow))]
    rounds_before = [c.rounds for c in others]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    count_cases("slow_clients", len(slow))
    for (transport, _payload, burst), (closed_after, received) in zip(slow, results):
        # one budget per frame from its first byte, whether header or body is slow
        assert read_timeout_s - 0.05 <= closed_after <= read_timeout_s + 1.5, (
            transport, burst, closed_after)
        assert received == b"", received  # a timeout is not answered: the server just closes
    for client in others:  # the well-behaved clients never noticed
        assert client.is_alive() and client.error is None, client.error
    assert all(c.rounds > r + 5 for c, r in zip(others, rounds_before)), [c.rounds for c in others]
    for client in others:
        client.finish()
        # never held up by a slow client (that would take a whole read timeout)
        assert client.max_round_s < read_timeout_s, client.max_round_s
    # every connection is gone but the STATUS query's own; a timeout is no protocol error
    wait_for(lambda: daemon.status()["connections"] == 1, 10, what="connections to close")
    assert daemon.status()["protocol_errors"] == 0


def padded(kind: str, size: int) -> bytes:
    """A frame whose body is exactly ``size`` bytes: a big array of zeros in one place."""
    prefix, suffix = {
        "ping_pad": ('{"type": "PING", "pad": [', "]}"),
        "token": ('{"type": "PING", "token": "', '"}'),
        "type_array": ('{"type": [', "]}"),
        "obs_flat": ('{"type": "EPISODES", "episodes": [{"obs": [', '], "actions": [], '
                     '"rewards": [], "is_terminated": true, "is_truncated": false}]}'),
        "rewards": ('{"type": "EPISODES", "episodes": [{"obs": [[0, 0, 0, 0], [0, 0, 0, 0]], '
                    '"actions": [1], "is_terminated": true, "is_truncated": false, '
                    '"rewards": [', "]}]}"),
        "actions": ('{"type": "EPISODES_AND_GET_STATE", "episodes": [{"obs": [[0, 0, 0, 0]], '
                    '"rewards": [], "is_terminated": true, "is_truncated": false, '
                    '"actions": [', "]}]}"),
    }[kind]
    room = size - len(prefix) - len(suffix)
    unit = "a" if kind == "token" else "0,"
    filler = (unit * (room // len(unit) + 1))[:room]
    if unit == "0,":  # no trailing comma: pad with spaces instead (JSON whitespace)
        filler = filler.rstrip(",")
        filler += " " * (room - len(filler))
    body = (prefix + filler + suffix).encode()
    assert len(body) == size, (kind, len(body), size)
    return frame(body)


def big_valid_episode(limit: int) -> bytes:
    """The longest valid CartPole fragment whose frame body fits ``limit`` bytes."""
    row = "[0.01,-0.02,0.03,0.04]"
    steps = (limit - 200) // (len(row) + len("1,") + len("1.0,") + 1)
    body = ('{"type": "EPISODES", "episodes": [{"obs": [' + ",".join([row] * (steps + 1)) +
            '], "actions": [' + ",".join(["1"] * steps) + '], "rewards": [' +
            ",".join(["1.0"] * steps) + '], "is_terminated": false, "is_truncated": true}]}')
    assert len(body) <= limit
    return frame(body)


HUGE_KINDS = ("ping_pad", "token", "type_array", "obs_flat", "rewards", "actions")


def test_huge_arrays_up_to_the_frame_limit(daemon_factory):
    limit = 1_000_000
    # a train batch larger than everything sent here: the learner stays idle (fast stop)
    daemon = daemon_factory("--set", f"server.max_message_bytes={limit}",
                            "--set", "sampling.train_batch_size=65536")
    huge = FuzzTarget(daemon, Oracle(("server", "max_message_bytes", limit)))
    client = ValidClient(f"tcp://127.0.0.1:{daemon.port}", episodes=False)
    client.start()
    wait_for(lambda: client.rounds >= 2 or client.error, 60, 0.05, "the valid client")
    rss_before = sum(process_rss(daemon).values())
    fixed = [padded("ping_pad", limit), padded("ping_pad", limit + 1), b"99999999",
             padded("token", limit) + frame({"type": "GET_CONFIG"}),
             big_valid_episode(limit) + frame({"type": "PING"})]
    expected = huge.run("huge_arrays", fixed, timeout_s=120)
    assert expected[0] == [("PONG", "")] and expected[3] == [("PONG", ""), ("SET_CONFIG", "")]
    assert expected[1] == [("ERROR", f"frame of {limit + 1} bytes exceeds max_message_bytes="
                                     f"{limit}")]
    assert expected[4] == [("PONG", "")]  # ~28k steps accepted

    @fuzz_settings(16)
    @given(kind=st.sampled_from(HUGE_KINDS), size=st.integers(limit - 4000, limit + 4000))
    def near_the_limit(kind, size):
        huge.run("huge_arrays", [padded(kind, size)], timeout_s=120)

    near_the_limit()
    assert daemon.proc.poll() is None
    assert daemon.status()["protocol_errors"] == huge.expected_errors > 0
    growth = sum(process_rss(daemon).values()) - rss_before
    assert growth < MAX_RSS_GROWTH_BYTES, f"RSS grew by {growth / 2**20:.0f} MiB"
    client.finish()


# ---------------------------------------------------------------- afterwards
# ---------------------------------------------------------------- composite spaces
COMPOSITE_CONFIG = """
[env]
action_mask_key = "action_mask"

[env.observation_space]
type = "Dict"
spaces.image = { type = "Box", shape = [4, 4, 1], dtype = "uint8", low = 0, high = 255 }
spaces.vec = { type = "Box", shape = [2], low = -1.0, high = 1.0 }
spaces.pair = { type = "Tuple", spaces = [{ type = "Discrete", n = 3, start = 1 }, { type = "MultiBinary", n = 2 }] }
spaces.action_mask = { type = "MultiBinary", n = 5 }

[env.action_space]
type = "Dict"
spaces.choice = { type = "MultiDiscrete", nvec = [3, 2] }
spaces.push = { type = "Box", shape = [1], low = -1.0, high = 1.0 }
"""


def configured_target(tmp_path_factory, name: str, config: str):
    """Another daemon under fuzz on its own config file, and its oracle (yields, then stops it)."""
    from tests.conftest import DaemonPool
    base = tmp_path_factory.mktemp(name)
    (base / "rlinkd.toml").write_text(config)
    pool = DaemonPool(base)
    daemon = pool.start("--config", str(base / "rlinkd.toml"))
    status = daemon.status()
    yield FuzzTarget(daemon, Oracle(path=base / "rlinkd.toml"),
                     errors_before=status["protocol_errors"], rss_before=process_rss(daemon),
                     pids_before={r: c["pid"] for r, c in status["children"].items()})
    pool.close()


@pytest.fixture(scope="module")
def composite_target(tmp_path_factory):
    """A second daemon, on a Dict/Tuple observation with a uint8 image and an action mask."""
    yield from configured_target(tmp_path_factory, "composite", COMPOSITE_CONFIG)


def composite_episode(rng: random.Random, steps: int) -> dict:
    """A valid episode of the composite daemon's spaces, in a random mix of the wire forms."""
    np_rng = np.random.default_rng(rng.getrandbits(32))
    images = np_rng.integers(0, 256, (steps + 1, 4, 4, 1), dtype=np.uint8)
    vecs = np_rng.uniform(-1, 1, (steps + 1, 2)).astype(np.float32)
    firsts, bits = np_rng.integers(1, 4, steps + 1), np_rng.integers(0, 2, (steps + 1, 2))
    masks = np.ones((steps + 1, 5), np.int8)
    if rng.random() < 0.5:
        obs: object = {"image": encode_compact(images) if rng.random() < 0.5 else images.tolist(),
                       "vec": encode_compact(vecs) if rng.random() < 0.5 else vecs.tolist(),
                       "pair": [[int(f), b.tolist()] for f, b in zip(firsts, bits)],
                       "action_mask": masks.tolist()}
    else:
        obs = [{"image": images[t].tolist(), "vec": vecs[t].tolist(),
                "pair": [int(firsts[t]), bits[t].tolist()], "action_mask": masks[t].tolist()}
               for t in range(steps + 1)]
    actions = [{"choice": [rng.randrange(3), rng.randrange(2)], "push": [rng.uniform(-1, 1)]}
               for _ in range(steps)]
    return {"obs": obs, "actions": actions, "rewards": [rng.uniform(-1, 1) for _ in range(steps)],
            "is_terminated": rng.random() < 0.5, "is_truncated": False}


def corrupt_compact(rng: random.Random, msg: dict) -> dict:
    """Edit one compact array, if the message has one: dtype, shape, bytes or keys."""
    compacts = [node for node in _walk(msg) if isinstance(node, dict) and "b64" in node]
    if compacts:
        node = rng.choice(compacts)
        key, value = rng.choice([("dtype", "complex64"), ("dtype", "float64"), ("dtype", "int8"),
                                 ("shape", [1, 2, 3]), ("shape", [-1]), ("b64", "!!!"),
                                 ("b64", node["b64"][:-8]), ("extra", 1)])
        node[key] = value
    return msg


def _walk(node):
    yield node
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    for child in children:
        yield from _walk(child)


@fuzz_settings(40)
@given(seed=seeds, steps=st.integers(0, 6))
def test_mutated_composite_episodes(composite_target, seed, steps):
    """Valid composite episodes (per-step, columnar, compact leaves), then JSON-tree edits
    anywhere and compact-array corruptions: every reply is exactly the oracle's."""
    rng = random.Random(seed)
    payloads = []
    for i in range(CASES):
        msg = {"type": "EPISODES", "episodes": [composite_episode(rng, steps)]}
        if i % 4:
            msg = mutate_json(rng, msg) if i % 4 != 1 else corrupt_compact(rng, msg)
        payloads.append(frame(msg))
    target = composite_target
    target.run("composite_episodes", payloads)


def healthy_after_fuzzing(target: FuzzTarget, min_errors: int) -> dict:
    """The daemon lives, no child restarted, protocol_errors grew by exactly the ERRORs the
    oracle predicted (more than ``min_errors``), no traceback logged; its status."""
    daemon = target.daemon
    assert daemon.proc.poll() is None, "the daemon died"
    status = daemon.status()
    grew = status["protocol_errors"] - target.errors_before
    assert grew == target.expected_errors > min_errors, (grew, target.expected_errors)
    children = status["children"]
    assert {r: c["pid"] for r, c in children.items()} == target.pids_before, children
    log = daemon.log()
    assert "Traceback" not in log, log[log.index("Traceback") - 2000:][:6000]
    return status


def test_composite_daemon_is_healthy_after_fuzzing(composite_target):
    status = healthy_after_fuzzing(composite_target, 300)
    assert status["env_steps"] > 0, status  # valid episodes were accepted too


# ---------------------------------------------------------------- many agents, two policies
AGENTS_CONFIG = """
[server]
max_agents_per_connection = 4
[policies.red]
trainable = true
[policy_mapping]
"red_*" = "red"
"""
AGENT_IDS = ["red_1", "red_2", "a", "b", "c", "x" * 65, "\u0001", 5, "", None]
EPISODE_IDS = ["1", "2", None, "", 7]
POLICY_IDS = [None, None, "red", "default", "nope"]


@pytest.fixture(scope="module")
def agents_target(tmp_path_factory):
    """A third daemon: two policies, a mapping, at most 4 agents per connection."""
    yield from configured_target(tmp_path_factory, "agents", AGENTS_CONFIG)


def agent_episode(rng: random.Random) -> dict:
    """A valid CartPole-shaped fragment with random (valid or not) agent/episode/policy ids."""
    steps = rng.randrange(0, 4)
    ep = {"obs": [[rng.uniform(-0.1, 0.1) for _ in range(4)] for _ in range(steps + 1)],
          "actions": [rng.randrange(2) for _ in range(steps)], "rewards": [1.0] * steps,
          "is_terminated": rng.random() < 0.4, "is_truncated": False}
    for key, choices in (("agent_id", AGENT_IDS), ("episode_id", EPISODE_IDS),
                         ("policy_id", POLICY_IDS)):
        value = rng.choice(choices)
        if value is not None:
            ep[key] = value
    return ep


@fuzz_settings(30)
@given(seed=seeds)
def test_agent_ids_policies_and_episode_ids(agents_target, seed):
    """Connections of 1-3 EPISODES messages whose fragments name agents, episodes and
    policies (good and bad; limits crossed across messages), some JSON-mutated: every reply
    is exactly the oracle's."""
    rng = random.Random(seed)
    payloads = []
    for i in range(CASES):
        frames = []
        for _ in range(rng.randrange(1, 4)):
            msg = {"type": "EPISODES", "episodes": [agent_episode(rng) for _ in range(rng.randrange(1, 5))]}
            frames.append(frame(mutate_json(rng, msg) if i % 5 == 4 else msg))
        payloads.append(b"".join(frames))
    agents_target.run("agent_episodes", payloads)


def test_agents_daemon_is_healthy_after_fuzzing(agents_target):
    status = healthy_after_fuzzing(agents_target, 200)
    assert status["policies"]["red"]["env_steps"] > 0 and status["policies"]["default"]["env_steps"] > 0


# ---------------------------------------------------------------- a policy with memory
RECURRENT_CONFIG = """
[ppo]
recurrent = "gru"
recurrent_size = 3
max_seq_len = 2
"""
STATE_WIDTH = 3   # a GRU's state: [h], recurrent_size wide
SEQ_LEN = 2


@pytest.fixture(scope="module")
def recurrent_target(tmp_path_factory):
    """A fourth daemon: CartPole with a GRU policy, whose fragments carry "state_in"."""
    yield from configured_target(tmp_path_factory, "recurrent", RECURRENT_CONFIG)


def recurrent_episode(rng: random.Random) -> dict:
    """A CartPole fragment with a "state_in" that is right (list or compact), missing, of the
    wrong shape or not finite."""
    steps = rng.randrange(0, 6)
    rows = -(-steps // SEQ_LEN)
    state = np.array([[rng.uniform(-1, 1) for _ in range(STATE_WIDTH)] for _ in range(rows)],
                     np.float32).reshape(rows, STATE_WIDTH)
    ep = {"obs": [[rng.uniform(-0.1, 0.1) for _ in range(4)] for _ in range(steps + 1)],
          "actions": [rng.randrange(2) for _ in range(steps)], "rewards": [1.0] * steps,
          "is_terminated": rng.random() < 0.4, "is_truncated": False}
    kind = rng.randrange(6)
    if kind == 1:
        state = np.zeros((rows + 1, STATE_WIDTH), np.float32)  # one row too many
    elif kind == 2 and rows:
        state[rng.randrange(rows), rng.randrange(STATE_WIDTH)] = rng.choice([np.nan, np.inf])
    elif kind == 3:
        state = state[:, :-1]                                  # too narrow
    if kind != 4:  # (4: no state at all)
        ep["state_in"] = encode_compact(state) if rng.random() < 0.5 else state.tolist()
    return ep


@fuzz_settings(20)
@given(seed=seeds)
def test_recurrent_fragments(recurrent_target, seed):
    """EPISODES with fragments of a recurrent policy, their "state_in" good and bad (some
    JSON-mutated): every reply is exactly the oracle's, a bad state an ERROR to its client."""
    rng = random.Random(seed)
    payloads = []
    for i in range(CASES):
        msg = {"type": "EPISODES", "episodes": [recurrent_episode(rng) for _ in range(rng.randrange(1, 3))]}
        payloads.append(frame(mutate_json(rng, msg) if i % 5 == 4 else msg))
    recurrent_target.run("recurrent_episodes", payloads)


def test_recurrent_daemon_is_healthy_after_fuzzing(recurrent_target):
    status = healthy_after_fuzzing(recurrent_target, 200)
    assert status["env_steps"] > 0, status  # fragments with a good state were learned from


# ---------------------------------------------------------------- server-side actions
SERVE_IDS = ["e1", "e2", "e3", "", "x" * 65, 7, None]
SERVE_REPLIES = {"PONG", "EPISODE_STARTED", "ACTION", "ACTIONS", "ERROR"}


def serving_message(rng: random.Random) -> dict:
    """A serving, evaluation or metrics message over a few episode ids (good and bad)."""
    eid = rng.choice(SERVE_IDS)
    obs = rng.choice([[0.01, 0.02, 0.03, 0.04], [0.01] * 4, [1, 2], "obs", [[0.0] * 4], None])
    kind = rng.choice(["START_EPISODE", "START_EPISODE", "GET_ACTION", "GET_ACTION", "STEP",
                       "STEP", "LOG_RETURNS", "END_EPISODE", "STEP_BATCH", "EVAL_RESULTS", "METRICS"])
    if kind == "START_EPISODE":
        return {"type": kind, "episode_id": eid, "training_enabled": rng.choice([None, True, False])}
    if kind in ("GET_ACTION", "END_EPISODE"):
        return {"type": kind, "episode_id": eid, "observation": obs}
    if kind in ("STEP", "LOG_RETURNS"):
        return {"type": kind, "episode_id": eid, "observation": obs, "reward": rng.choice([1.0, "1", None]),
                "terminated": rng.random() < 0.2}
    if kind == "STEP_BATCH":
        return {"type": kind, "steps": [{"episode_id": rng.choice(SERVE_IDS), "observation": obs,
                                         "start": rng.random() < 0.5, "reward": rng.choice([None, 1.0])}
                                        for _ in range(rng.randrange(0, 4))]}
    if kind == "EVAL_RESULTS":
        return {"type": kind, "episodes": [{"episode_return": rng.choice([1.0, "x"]),
                                            "episode_length": rng.choice([3, -1]),
                                            "policy_id": rng.choice([None, "default", "nobody"])}]}
    return {"type": kind, "metrics": {rng.choice(["fps", "sim/lag", "bad name", "x" * 70]): 1.0}}


@fuzz_settings(25)
@given(seed=seeds)
def test_serving_messages(target, seed):
    """Connections of 1-6 serving messages (valid and not, some JSON-mutated): every reply is
    a serving reply, a connection gets at most one ERROR and nothing after it, and every
    ERROR is counted (the final health check compares the daemon's count)."""
    rng = random.Random(seed)
    payloads = []
    for i in range(CASES):
        msgs = [serving_message(rng) for _ in range(rng.randrange(1, 7))]
        payloads.append(b"".join(frame(mutate_json(rng, m) if i % 5 == 4 else m) for m in msgs))
    transports = [("tcp", "unix")[i % 2] for i in range(len(payloads))]
    conns = exchange(target.daemon, list(zip(transports, payloads)), 60.0)
    for payload, conn in zip(payloads, conns):
        got, whole = parse_replies(bytes(conn.data))
        kinds = [kind for kind, _ in got]
        assert set(kinds) <= SERVE_REPLIES, (kinds, payload[:300])
        assert "ERROR" not in kinds[:-1], (kinds, payload[:300])
        assert whole or conn.reset, (bytes(conn.data)[-200:], payload[:300])
        target.expected_errors += kinds.count("ERROR")
    count_cases("serving", len(payloads))


def direct_case(daemon: DaemonProcess, transport: str, payload: bytes) -> tuple[bytes, bool]:
    """PING + SERVE_DIRECT (answered by the collector), then ``payload`` to the inference
    role, the write side shut, everything read to EOF: (bytes after READY, reset)."""
    sock = open_socket(daemon, transport)
    sock.setblocking(True)
    sock.settimeout(30)
    try:
        sock.sendall(frame({"type": "PING"}) + frame({"type": "SERVE_DIRECT"}))
        assert [raw_recv(sock)["type"] for _ in range(2)] == ["PONG", "SERVE_DIRECT_READY"]
        data = bytearray()
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
            while chunk := sock.recv(1 << 16):
                data += chunk
        except (ConnectionResetError, BrokenPipeError):
            return bytes(data), True
        return bytes(data), False
    finally:
        sock.close()


@fuzz_settings(10)
@given(seed=seeds)
def test_direct_serving_messages(target, seed):
    """The serving fuzz on connections handed to the inference role (SERVE_DIRECT): the
    same reply rules, ERRORs counted by the role (``direct_errors``)."""
    rng = random.Random(seed)
    for i in range(CASES):
        msgs = [serving_message(rng) for _ in range(rng.randrange(1, 7))]
        payload = b"".join(frame(mutate_json(rng, m) if i % 5 == 4 else m) for m in msgs)
        data, reset = direct_case(target.daemon, ("tcp", "unix")[i % 2], payload)
        got, whole = parse_replies(data)
        kinds = [kind for kind, _ in got]
        assert set(kinds) <= SERVE_REPLIES, (kinds, payload[:300])
        assert "ERROR" not in kinds[:-1], (kinds, payload[:300])
        assert whole or reset, (data[-200:], payload[:300])
        target.expected_direct_errors += kinds.count("ERROR")
    count_cases("direct_serving", CASES)


def test_zz_daemon_is_healthy_after_fuzzing(target):
    """Runs last: the checks over the whole module's fuzzing."""
    missing = set(FAMILIES) - set(TALLY.families)
    assert not missing, f"run the whole module: fuzz families {sorted(missing)} did not run"
    daemon = target.daemon
    assert daemon.proc.poll() is None, "the daemon died"
    expected = target.expected_errors + target.expected_direct_errors  # (serving connections' are
    status = wait_for(lambda: (s := daemon.status())["protocol_errors"]  # the role's, reported once a second)
                      - target.errors_before >= expected and s, 10, what="every ERROR counted")
    grew = status["protocol_errors"] - target.errors_before
    assert grew == expected and target.expected_errors > 1000, (grew, target.expected_errors)
    direct = status["inference"]["direct_errors"] - target.direct_errors_before
    assert direct >= target.expected_direct_errors > 50, (direct, target.expected_direct_errors)
    children = status["children"]
    assert {r: c["pid"] for r, c in children.items()} == target.pids_before, children
    assert all(c["alive"] and c["restarts"] == 0 for c in children.values()), children
    rss_after = process_rss(daemon)
    growth = sum(rss_after.values()) - sum(target.rss_before.values())
    per_process = {k: (rss_after[k] - target.rss_before[k]) // 2**20 for k in rss_after}
    assert growth < MAX_RSS_GROWTH_BYTES, f"RSS grew by {growth / 2**20:.0f} MiB: {per_process}"
    for client in target.clients:
        client.finish()
        assert client.rounds >= 10, client.rounds
    # batch_rejected is the learner's own defence against non-finite batches (see
    # test_extreme_finite_values_do_not_poison_the_weights); any other error is a failure
    log = "\n".join(line for line in daemon.log().splitlines() if "batch_rejected" not in line)
    for bad in ("Traceback", "Unhandled exception", '"level": "error"', '"level": "critical"'):
        assert bad not in log, f"daemon log has {bad!r}:\n{log[log.index(bad) - 2000:][:6000]}"
    elapsed = time.monotonic() - TALLY.started
    print(f"\nfuzz: {TALLY.cases} cases in {elapsed:.1f} s {TALLY.families}; protocol errors "
          f"+{grew}; RSS growth {growth / 2**20:.1f} MiB {per_process}; valid client rounds "
          f"{[c.rounds for c in target.clients]}")
    assert TALLY.cases >= MIN_TOTAL_CASES, TALLY.cases
    write_report(os.environ.get("RLINKD_FUZZ_REPORT"), elapsed, grew, growth, daemon)


def write_report(path: str | None, elapsed: float, grew: int, growth: int, daemon) -> None:
    """With RLINKD_FUZZ_REPORT=FILE, the figures for BENCHMARKS.md's reliability table."""
    if not path:
        return
    report = {"command": "RLINKD_FUZZ_REPORT=bench/results/fuzz.json .venv/bin/python -m pytest -q "
                         "tests/process/test_fuzz_live.py",
              "measured_at": time.strftime("%Y-%m-%d %H:%M"), "cases": TALLY.cases,
              "families": TALLY.families, "elapsed_s": round(elapsed, 1), "protocol_errors": grew,
              "daemon_deaths": 0 if daemon.proc.poll() is None else 1,
              "child_restarts": sum(c["restarts"] for c in daemon.status()["children"].values()),
              "rss_growth_mb": round(growth / 2**20, 1),
              "load_avg_1m_at_end": round(os.getloadavg()[0], 2)}
    with open(path, "w") as f:
        json.dump(report, f, indent=1)

