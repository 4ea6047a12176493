"""daemon.inference.fastpath + native/direct.c: direct connections' plain steps in native code.

The native path takes a connection only while it is idle and gives it back at the first
thing it does not do, so its contract is: for any sequence of bytes a client sends, the
role does exactly what the Python path does -- the same lane writes, the same replies byte
for byte, the same connection closes. ``Pair`` runs one script against two
``DirectConnections`` (native path on and off) and compares all three; the property test
draws scripts from plain steps in many spellings, their near misses (a key too many, an
escape, a number outside the Box, a frame split across reads) and every other serving
message. The serving turn is played by ``answer``: every pending lane answered with a
counter's action (a status other than OK when the script says), as the inference role
would.
"""
from __future__ import annotations

import json
import socket

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol import serving as s
from rlinkd.client_lib.protocol.spaces import Box, Discrete
from rlinkd.daemon.inference.direct import DirectConnections
from rlinkd.daemon.inference.front import EpisodeLane, Episodes, Front, LanePool
from rlinkd.daemon.inference.netnative import native_module
from rlinkd.shm.lanes import STATUS_LOST, STATUS_OK, LaneArea, LaneLayout
from rlinkd.shm.records import StepLayout

needs_native = pytest.mark.skipif(native_module() is None, reason="the _native extension is not built")
LANES = 6
ACTIONS = Discrete(3, start=-1)  # (a start: the reply's action is the lane's index + start)
OBS = [0.1, -0.2, 0.3, 4.5]


class Side:
    """One DirectConnections with its client socket and a log of what it published."""

    def __init__(self, path: str, native: bool) -> None:
        self.area = LaneArea.create(path, LaneLayout(StepLayout.flat(4, 1, 3)), LANES)
        pool = LanePool(self.area, Box((4,), low=-5.0, high=5.0), ACTIONS, "default")
        self.d = DirectConnections(Front({"default": pool}, lambda _agent: "default", 3, "inference.tcp_lanes"),
                                   max_connections=4, max_message_bytes=1 << 16, idle_timeout_s=60.0,
                                   read_timeout_s=5.0, native=native)
        ours, theirs = socket.socketpair()
        self.d.add(theirs.detach())
        self.client = ours
        self.client.setblocking(False)
        self.log: list[tuple] = []
        self.received = b""

    def turn(self, statuses: list[int], counter: list[int]) -> None:
        """One role turn: read, answer every pending lane, reply."""
        self.d.service(self.d.epoll.poll(0))
        lanes = self.area.lanes
        for i in np.flatnonzero(lanes["req_seq"] != lanes["resp_seq"]):
            row = lanes[i]
            self.log.append((int(i), int(row["op"]), int(row["flags"]), row["reward"].tobytes(),
                             row["obs"].tobytes(), int(row["group"]), int(row["group_size"])))
            status = statuses[counter[0] % len(statuses)] if statuses else STATUS_OK
            lanes["action"][i], lanes["status"][i] = float(counter[0] % 3), status
            lanes["weights_seq_no"][i] = 7 + counter[0]
            counter[0] += 1
            lanes["resp_seq"][i] = lanes["req_seq"][i]
        if self.d.answering:
            self.d.answer()
        self.read()

    def read(self) -> None:
        try:
            while chunk := self.client.recv(1 << 16):
                self.received += chunk
        except BlockingIOError:
            pass

    def close(self) -> None:
        self.d.close_all()
        self.client.close()
        self.area.close()


class Pair:
    def __init__(self, tmp_path, tag: str = "") -> None:
        self.native = Side(str(tmp_path / f"native{tag}"), True)
        self.python = Side(str(tmp_path / f"python{tag}"), False)
        self.counters = {"native": [0], "python": [0]}

    def send(self, data: bytes, statuses: list[int], turns: int = 3) -> None:
        for name, side in (("native", self.native), ("python", self.python)):
            if side.d.conns:
                try:
                    side.client.sendall(data)
                except OSError:  # (the role closed it after an ERROR: both do, compared below)
                    pass
            for _ in range(turns):
                side.turn(statuses, self.counters[name])

    def check(self) -> None:
        assert self.native.received == self.python.received
        assert self.native.log == self.python.log
        assert len(self.native.d.conns) == len(self.python.d.conns)

    def close(self) -> None:
        self.native.close()
        self.python.close()


def frame(body: str | bytes) -> bytes:
    data = body.encode() if isinstance(body, str) else body
    return b"%08d" % len(data) + data


def plain(eid: str, obs: list[str], reward: str, batch: bool, order: list[int], sep: str = ", ",
          extra: str = "") -> str:
    """A plain step's JSON, spelled out: the keys in ``order``, numbers as given."""
    fields = [f'"episode_id": {json.dumps(eid)}', f'"observation": [{sep.join(obs)}]',
              f'"reward": {reward}']
    fields = [fields[i] for i in order] + ([extra] if extra else [])
    if batch:
        return '{"type": "STEP_BATCH", "steps": [{' + sep.join(fields) + "}]}"
    return '{"type": "STEP", ' + sep.join(fields) + "}"


def start(eid: str, evaluate: bool = False) -> bytes:
    return codec.encode(s.StepBatch((s.BatchEntry(eid, OBS, start=True,
                                                  training_enabled=False if evaluate else None),)))


@pytest.fixture
def pair(tmp_path):
    p = Pair(tmp_path)
    yield p
    p.close()


# ------------------------------------------------------------------ the contract, by example
@needs_native
def test_plain_steps_are_carried_out_natively_with_the_python_paths_replies(pair):
    pair.send(start("a"), [])
    for k in range(5):
        pair.send(frame(plain("a", ["0.5", "-1", "2.5e-1", "3"], "1.0", batch=k % 2 == 0, order=[0, 1, 2])), [])
    pair.check()
    assert pair.native.d.counts["direct_native_messages"] == 5
    assert pair.python.d.counts["direct_native_messages"] == 0
    assert pair.native.d.counts["direct_messages"] == pair.python.d.counts["direct_messages"] == 6
    replies = [codec.decode_body(body) for body in _bodies(pair.native.received)]
    assert replies[1] == s.Actions([0], [8]) and replies[2] == s.Action("a", 1, 9)


@needs_native
def test_an_episode_end_a_log_returns_and_an_unknown_id_go_back_to_python(pair):
    pair.send(start("a", evaluate=True), [])
    pair.send(frame(plain("a", ["0.5"] * 4, "1", True, [2, 0, 1])), [])
    pair.send(codec.encode(s.LogReturns("a", 0.5)), [])
    pair.send(frame(plain("a", ["0.5"] * 4, "1", True, [0, 1, 2])), [])  # (in Python: reward 1.5)
    pair.send(frame(plain("a", ["0.5"] * 4, "1", False, [0, 1, 2])), [])  # (native again)
    pair.send(codec.encode(s.Step("a", 1.0, OBS, terminated=True)), [])
    pair.send(frame(plain("a", ["0.5"] * 4, "1", True, [0, 1, 2])), [])  # (ended: an ERROR)
    pair.check()
    assert pair.native.d.counts["direct_native_messages"] == 2
    assert not pair.native.d.conns and b"already ended" in pair.native.received


@needs_native
def test_a_reward_beyond_float32_goes_back_to_python_and_is_refused(pair):
    pair.send(start("a"), [])
    pair.send(frame(plain("a", ["0.5"] * 4, "3.4e38", True, [0, 1, 2])), [])  # (float32 holds it)
    pair.send(frame(plain("a", ["0.5"] * 4, "-1e308", True, [0, 1, 2])), [])
    pair.check()
    assert pair.native.d.counts["direct_native_messages"] == 1
    assert b"float32 range" in pair.native.received and not pair.native.d.conns


@needs_native
def test_an_error_status_in_the_answer_is_refused_as_in_python(pair):
    pair.send(start("a"), [])
    pair.send(frame(plain("a", ["0.5"] * 4, "1", True, [0, 1, 2])), [STATUS_LOST])
    pair.check()
    assert b"daemon restart lost it" in pair.native.received and not pair.native.d.conns


@needs_native
def test_replies_the_socket_cannot_take_go_out_later_in_order(pair):
    """A client that does not read: the native path gives the connection back with the
    reply it could not send; every reply still arrives, in order."""
    pair.send(start("a"), [])
    side = pair.native
    side.client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn = next(iter(side.d.conns.values()))
    sent = 0
    while conn.fast or sent < 3:
        side.client.sendall(frame(plain("a", ["0.5"] * 4, "1", True, [0, 1, 2])))
        for _ in range(2):
            side.d.service(side.d.epoll.poll(0))
            _answer_all(side)
            side.d.answer()
        sent += 1
        assert sent < 10_000, "the socket never filled"
    assert conn.outbuf and side.d.counts["direct_native_messages"] >= 1
    bodies = []
    for _ in range(10 * sent):
        side.read()
        side.d.service(side.d.epoll.poll(0))
        _answer_all(side)
        if side.d.answering:
            side.d.answer()
        bodies = _bodies(side.received)
        if len(bodies) == sent + 1:
            break
    assert len(bodies) == sent + 1
    seqs = [codec.decode_body(b).weights_seq_nos[0] for b in bodies]  # type: ignore[attr-defined]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


@needs_native
def test_a_partial_frame_on_a_native_connection_still_times_out(pair):
    pair.send(start("a"), [])
    side = pair.native
    side.client.sendall(b"00000100{")
    side.turn([], [0])
    fd, conn = next(iter(side.d.conns.items()))
    assert conn.fast
    since = side.d.fast.native.times(fd)[1]  # type: ignore[union-attr]
    assert since > 0
    side.d.expire(since + 4.0)
    assert side.d.conns
    side.d.expire(since + 6.0)
    assert not side.d.conns


@needs_native
def test_a_connection_whose_messages_never_suit_it_is_handed_over_less_often(pair):
    """STEP_BATCHes of two entries are always given back: the hand-overs back off."""
    pair.send(start("a") + start("b"), [])
    two = codec.encode(s.StepBatch((s.BatchEntry("a", OBS, 1.0), s.BatchEntry("b", OBS, 1.0))))
    for _ in range(40):
        pair.send(two, [], turns=2)
    pair.check()
    conn = next(iter(pair.native.d.conns.values()))
    assert conn.misses >= 4 and conn.skip > 0


@needs_native
def test_close_all_drops_the_native_path_first(pair):
    """(The native path holds views of the lane areas, which the role closes next: a view
    left would read unmapped memory.)"""
    pair.send(start("a"), [])
    d = pair.native.d
    assert d.fast is not None and d.n_fast == 1
    d.close_all()
    assert d.fast is None and not d.conns


@needs_native
def test_the_idle_clock_runs_on_across_a_hand_over(pair):
    pair.send(start("a"), [])
    fd, conn = next(iter(pair.native.d.conns.items()))
    assert conn.fast and pair.native.d.fast.native.times(fd)[0] == conn.last_seen  # type: ignore[union-attr]


@needs_native
def test_a_connection_of_more_episodes_than_the_native_path_keeps_stays_in_python(pair):
    fast = pair.native.d.fast
    assert fast is not None
    eps = Episodes()
    for i in range(fast.max_episodes + 1):
        eps.open[f"e{i}"] = EpisodeLane("default", i % LANES, False, started=True)
    assert fast.steppable(eps) == []
    eps.open.pop("e0")
    assert len(fast.steppable(eps)) == fast.max_episodes


# ------------------------------------------------------------------ the contract, drawn
GOOD = st.one_of(st.floats(-4.9, 4.9, allow_nan=False).map(repr), st.integers(-4, 4).map(str),
                 st.sampled_from(["-0", "-0.0", "1e0", "2.5E-1", "-4.9e+0", "0.30000000000000004"]))
BAD = st.one_of(st.floats(-6.0, 6.0, allow_nan=False).filter(lambda x: abs(x) > 5.01).map(repr),
                st.sampled_from(["1e400", "1234567890123456", "01", "1.", ".5", "+1", "1e", "true", "null",
                                 '"1"', "NaN", "[1]"]))
SEPARATORS = st.sampled_from([", ", ",", " ,\n\t"])


@st.composite
def valid(draw) -> bytes:
    """A message the connection goes on after: a plain step of episode "a" in some spelling
    (most), or another serving message that keeps "a" and "b" open."""
    kind = draw(st.sampled_from(["plain"] * 10 + ["flags", "type-last", "log", "get", "two", "ping"]))
    if kind == "log":
        return codec.encode(s.LogReturns("a", draw(st.floats(-2, 2))))
    if kind == "get":
        return codec.encode(s.GetAction("a", OBS))
    if kind == "two":
        return codec.encode(s.StepBatch((s.BatchEntry("a", OBS, 1.0), s.BatchEntry("b", OBS, 1.0))))
    if kind == "ping":
        return codec.encode(codec.Ping())
    obs, reward = draw(st.lists(GOOD, min_size=4, max_size=4)), draw(GOOD)
    batch, order, sep = draw(st.booleans()), draw(st.permutations([0, 1, 2])), draw(SEPARATORS)
    extra = draw(st.sampled_from(['"terminated": false', '"truncated": false'])) if kind == "flags" else ""
    body = plain("a", obs, reward, batch, order, sep, extra)
    if kind == "type-last":
        kind_field = '"type": "STEP_BATCH", ' if batch else '"type": "STEP", '
        body = "{" + body[1:].replace(kind_field, "", 1)[:-1] + ", " + kind_field[:-2] + "}"
    return frame(body)


@st.composite
def last(draw) -> bytes:
    """A message after which the connection may close: a near miss of a plain step (a
    number outside the Box or not JSON, an id unknown, escaped or empty, a key too many, a
    flag set, a frame not JSON), or an episode's end."""
    kind = draw(st.sampled_from(["number"] * 3 + ["id", "extra", "flag", "raw", "end", "length"]))
    if kind == "end":
        return codec.encode(s.Step("a", 1.0, OBS, terminated=True))
    obs = draw(st.lists(GOOD, min_size=4, max_size=4))
    reward, eid, extra = draw(GOOD), "a", ""
    if kind == "number":
        where = draw(st.integers(0, 4))
        if where == 4:
            reward = draw(BAD)
        else:
            obs[where] = draw(BAD)
    elif kind == "length":
        obs = obs[:draw(st.sampled_from([0, 3]))] + ([] if draw(st.booleans()) else ["1.0", "1.0"])
    elif kind == "id":
        eid = draw(st.sampled_from(["b2", "c-1", 'q"x', "nobody", "", "x" * 65]))
    elif kind in ("extra", "flag"):
        extra = '"foo": 1' if kind == "extra" else draw(st.sampled_from(['"terminated": true', '"truncated": null',
                                                                        '"truncated": 0']))
    body = plain(eid, obs, reward, draw(st.booleans()), draw(st.permutations([0, 1, 2])), draw(SEPARATORS), extra)
    if kind == "raw":
        body = draw(st.sampled_from([body + "x", body[:-1], body.replace("[", "[[", 1), body.replace(":", " ", 1),
                                     body.replace('"a"', '"\\u0061"')]))
    return frame(body)


@st.composite
def scripts(draw) -> list[tuple[bytes, list[int], int]]:
    """(bytes to send, statuses of the answers, turns after) per step: episodes "a" and
    "b" started, valid messages, maybe one last near miss; a frame may be split in two
    sends or sent with the next one (pipelined)."""
    msgs = [start("a", draw(st.booleans())), start("b"), *draw(st.lists(valid(), min_size=1, max_size=10))]
    if draw(st.booleans()):
        msgs.append(draw(last()))
    out: list[tuple[bytes, list[int], int]] = []
    for msg in msgs:
        statuses = [STATUS_LOST] if draw(st.integers(0, 30)) == 0 else []
        cut = draw(st.integers(0, len(msg)))
        if 0 < cut < len(msg) and draw(st.integers(0, 3)) == 0:
            out += [(msg[:cut], statuses, 1), (msg[cut:], statuses, 3)]
        else:
            out.append((msg, statuses, draw(st.sampled_from([0, 1, 3, 3]))))
    return out


@needs_native
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=scripts())
def test_any_script_gets_the_same_lanes_replies_and_closes_from_both_paths(tmp_path_factory, script):
    p = Pair(tmp_path_factory.mktemp("pair"))
    try:
        for data, statuses, turns in script:
            p.send(data, statuses, turns)
        p.send(b"", [], 3)  # (whatever is left in flight)
        p.check()
    finally:
        p.close()


# ------------------------------------------------------------------ helpers
def _answer_all(side: Side) -> None:
    lanes = side.area.lanes
    idx = np.flatnonzero(lanes["req_seq"] != lanes["resp_seq"])
    lanes["action"][idx], lanes["status"][idx] = 1.0, STATUS_OK
    lanes["weights_seq_no"][idx] = np.arange(len(idx)) + lanes["weights_seq_no"].max() + 1
    lanes["resp_seq"][idx] = lanes["req_seq"][idx]


def _bodies(data: bytes) -> list[bytes]:
    out = []
    while len(data) >= 8:
        n = int(data[:8])
        if len(data) < 8 + n:
            break
        out.append(data[8:8 + n])
        data = data[8 + n:]
    return out
