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
import random
import select
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client_lib import codec
from client_lib.transport import RLlinkClient
from daemon.collector.core import CollectorCore
from daemon.config import load_config
from daemon.wiring import make_policy_spec, resolve_spaces
from shm.records import StepLayout
from tests.helpers import DaemonProcess, wait_for

pytestmark = pytest.mark.process

MIN_TOTAL_CASES = 10_000
MAX_RSS_GROWTH_BYTES = 100 * 1024 * 1024
FAMILIES = ("random_bytes", "mutated_frames", "truncated_frames", "hostile_episodes",
            "nesting_and_headers", "huge_arrays", "slow_clients")


def fuzz_settings(examples: int):
    # database=None: nothing written to the work tree; failures print a reproduction blob
    return settings(max_examples=examples, deadline=None, database=None, print_blob=True,
                    suppress_health_check=list(HealthCheck))


# ---------------------------------------------------------------- the oracle
class Oracle:
    """The collector's protocol core on the daemon's config: the replies a payload must get."""

    def __init__(self, *overrides: tuple[str, str, object]) -> None:
        cfg = load_config(overrides=list(overrides), resolve_dirs=False)
        obs, act = resolve_spaces(cfg)
        spec = make_policy_spec(cfg, obs, act)
        self.max_bytes = cfg.server.max_message_bytes
        self.core = CollectorCore(cfg, obs, act, StepLayout(obs.flat_size, act.flat_size,
                                                            spec.dist_size), spec.dist_size)

    def replies(self, payload: bytes, transport: str) -> list[tuple[str, str]]:
        """[(type, ERROR message or "")] the server must send for ``payload`` then EOF."""
        decoder = codec.FrameDecoder(self.max_bytes)
        decoder.feed(payload)
        session = self.core.open_session("oracle", transport)
        out: list[tuple[str, str]] = []
        try:
            while (body := decoder.next_body()) is not None:
                plan = self.core.handle(session, codec.decode_body(body))
                if plan.reply is not None:
                    out.append((codec.decode_body(plan.reply[codec.HEADER_BYTES:]).TYPE.value, ""))
                if plan.status:
                    out.append(("STATUS_REPORT", ""))
                if plan.newest_state or plan.wait_for_training:
                    out.append(("SET_STATE", ""))
        except codec.ProtocolError as exc:
            out.append(("ERROR", str(exc)[:1000]))
        finally:
            self.core.close_session(session)
        return out


def parse_replies(data: bytes) -> tuple[list[tuple[str, str]], bool]:
    """Decode the server's frames; also whether the bytes ended exactly on a frame boundary."""
    out, pos = [], 0
    while pos + codec.HEADER_BYTES <= len(data):
        size = codec.parse_header(data[pos:pos + codec.HEADER_BYTES], 1 << 30)
        end = pos + codec.HEADER_BYTES + size
        if end > len(data):
            break
        msg = codec.decode_body(data[pos + codec.HEADER_BYTES:end])
        out.append((msg.TYPE.value, msg.message if isinstance(msg, codec.Error) else ""))
        pos = end
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


class ValidClient(threading.Thread):
    """PING / GET_CONFIG / (EPISODES_AND_GET_STATE | GET_STATE) round trips until stopped."""

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


@dataclass
class FuzzTarget:
    daemon: DaemonProcess
    oracle: Oracle
    expected_errors: int = 0

    def run(self, family: str, payloads: list[bytes], transports: list[str] | None = None,
            timeout_s: float = 60.0) -> list[list[tuple[str, str]]]:
        """Run cases (alternating TCP / Unix unless given), check each against the oracle."""
        transports = transports or [("tcp", "unix")[i % 2] for i in range(len(payloads))]
        expected = [self.oracle.replies(p, t) for p, t in zip(payloads, transports)]
        t0 = time.monotonic()
        conns = exchange(self.daemon, list(zip(transports, payloads)), timeout_s)
        if time.monotonic() - t0 > 2: print("SLOW", family, time.monotonic() - t0, sum(b"EPISODES_AND" in p for p in payloads))
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
        TALLY.cases += len(payloads)
        TALLY.families[family] = TALLY.families.get(family, 0) + len(payloads)
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
    t = FuzzTarget(shared_daemon, Oracle())
    t.clients = clients
    t.errors_before = shared_daemon.status()["protocol_errors"]
    t.rss_before = process_rss(shared_daemon)
    t.pids_before = {r: c["pid"] for r, c in shared_daemon.status()["children"].items()}
    yield t
    for client in clients:
        client.stop_event.set()
    for client in clients:
        client.join(60)


# ---------------------------------------------------------------- valid frames to mutate
def frame(body: bytes | str | dict) -> bytes:
    if isinstance(body, dict):
        body = json.dumps(body)
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
    if steps and draw(st.booleans()):  # an empty [] is not accepted as [0, 2]
        episode["action_dist_inputs"] = [[draw(finite), draw(finite)] for _ in range(steps)]
    return episode


@st.composite
def valid_message(draw) -> dict:
    kind = draw(st.sampled_from(["PING", "PING", "GET_CONFIG", "GET_STATE", "STATUS",
                                 "EPISODES", "EPISODES", "EPISODES_AND_GET_STATE"]))
    if not kind.startswith("EPISODES"):
        return {"type": kind}
    episodes = draw(st.lists(valid_episode(), min_size=1, max_size=2))
    msg = {"type": kind, "episodes": episodes}
    if draw(st.booleans()):
        msg["env_steps" if draw(st.booleans()) else "timesteps"] = sum(
            len(e["actions"]) for e in episodes)
    return msg


@st.composite
def mutated_stream(draw) -> bytes:
    """1-3 valid frames, then 1-3 mutations anywhere (header or body)."""
    blob = bytearray(b"".join(frame(m) for m in draw(st.lists(valid_message(), min_size=1,
                                                                 max_size=3))))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["flip", "flip", "truncate", "insert", "delete", "header",
                                   "byte"]))
        pos = draw(st.integers(0, max(0, len(blob) - 1)))
        if op == "flip" and blob:
            blob[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "byte" and blob:
            blob[pos] = draw(st.sampled_from(b'0123456789[]{}",:.-eE \x00\xff'))
        elif op == "truncate":
            del blob[pos:]
        elif op == "insert":
            blob[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del blob[pos:pos + draw(st.integers(1, 8))]
        elif op == "header" and len(blob) >= 8:  # a wrong length in the first header
            size = int(blob[:8]) if bytes(blob[:8]).isdigit() else 0
            blob[:8] = b"%08d" % max(0, min(99_999_999, size + draw(st.integers(-20, 20))))
    return bytes(blob)


@st.composite
def truncated_stream(draw) -> bytes:
    """Valid frames, the last one cut anywhere (then the client closes)."""
    frames = [frame(m) for m in draw(st.lists(valid_message(), min_size=1, max_size=3))]
    last = frames[-1]
    return b"".join(frames[:-1]) + last[:draw(st.integers(0, len(last) - 1))]


# ---------------------------------------------------------------- hostile episodes
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4))
json_value = st.recursive(json_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=3), inner, max_size=3)),
    max_leaves=12)
numberish = st.one_of(st.integers(-3, 3), st.floats(-1e3, 1e3), st.sampled_from(
    [0.5, -0.0, 1e308, -1e308, 2**63, 2**64 - 1, -2**63, True, None, "1", float("nan")]))


@st.composite
def shaped_array(draw):
    """Nested lists of a random shape (sometimes ragged, sometimes with a foreign leaf)."""
    shape = draw(st.lists(st.integers(0, 4), min_size=0, max_size=3))
    def build(dims):
        if not dims:
            return draw(numberish)
        row = [build(dims[1:]) for _ in range(dims[0])]
        if row and draw(st.integers(0, 9)) == 0:
            row[-1] = draw(json_value)  # ragged or foreign
        return row
    return build(shape)


@st.composite
def hostile_episode(draw):
    base = draw(valid_episode())
    for key in draw(st.lists(st.sampled_from(sorted(base) + ["action_logp",
                                                             "action_dist_inputs", "extra"]),
                             min_size=1, max_size=3, unique=True)):
        how = draw(st.sampled_from(["array", "array", "value", "drop"]))
        if how == "drop":
            base.pop(key, None)
        else:
            base[key] = draw(shaped_array()) if how == "array" else draw(json_value)
    return base


@st.composite
def hostile_message(draw) -> bytes:
    msg = {"type": draw(st.sampled_from(["EPISODES", "EPISODES_AND_GET_STATE"]))}
    episodes = draw(st.lists(st.one_of(hostile_episode(), valid_episode(), json_value),
                             min_size=0, max_size=3))
    msg["episodes"] = draw(st.one_of(st.just(episodes), st.just(episodes), json_value))
    if draw(st.booleans()):
        msg[draw(st.sampled_from(["env_steps", "timesteps"]))] = draw(st.one_of(
            st.integers(-1, 12), json_value))
    if draw(st.booleans()):
        msg["weights_seq_no"] = draw(st.one_of(st.integers(-2**64, 2**64), json_value))
    # json.dumps, not orjson: NaN/Infinity literals and >64-bit integers reach the server
    body = json.dumps(msg, allow_nan=True)
    prefix = b""
    if draw(st.booleans()):  # sometimes after a valid request on the same connection
        prefix = frame(draw(valid_message()))
    return prefix + frame(body)


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
@given(st.lists(st.one_of(st.binary(max_size=300),
                          st.binary(max_size=300).map(lambda b: b"%08d" % len(b) + b),
                          st.binary(min_size=1, max_size=60).map(lambda b: b"000000" + b)),
                min_size=40, max_size=40))
def test_random_bytes(target, payloads):
    target.run("random_bytes", payloads)


@fuzz_settings(95)
@given(st.lists(mutated_stream(), min_size=40, max_size=40))
def test_mutated_valid_frames(target, payloads):
    target.run("mutated_frames", payloads)


@fuzz_settings(30)
@given(st.lists(truncated_stream(), min_size=40, max_size=40))
def test_truncated_frames_then_close(target, payloads):
    expected = target.run("truncated_frames", payloads)
    # a cut frame is never answered: the server just closes (no ERROR for a short read)
    assert all(not w or w[-1][0] != "ERROR" for w in expected)


@fuzz_settings(60)
@given(st.lists(hostile_message(), min_size=40, max_size=40))
def test_wrong_dtypes_and_shapes_in_episodes(target, payloads):
    target.run("hostile_episodes", payloads)


def test_deep_nesting_and_giant_headers(target):
    expected = target.run("nesting_and_headers", NESTING_CASES + HEADER_CASES,
                          ["tcp"] * len(NESTING_CASES + HEADER_CASES))
    target.run("nesting_and_headers", NESTING_CASES + HEADER_CASES,
               ["unix"] * len(NESTING_CASES + HEADER_CASES))
    assert expected[0][-1][0] == "ERROR" and "depth limit" in expected[0][-1][1]
    assert expected[4] == [("PONG", "")] and expected[5][0][0] == "ERROR"
    giant = expected[len(NESTING_CASES)]  # b"99999999": refused before any body byte
    assert giant == [("ERROR", "frame of 99999999 bytes exceeds max_message_bytes=67108864")]


@fuzz_settings(10)
@given(st.lists(nesting_or_header(), min_size=20, max_size=20))
def test_random_nesting_depths(target, payloads):
    target.run("nesting_and_headers", payloads)
