"""daemon.inference.direct: handed-over connections read, answered and closed by the role.

The role's serving turn is played by ``answer_lanes`` (every pending lane answered with
action 1, status OK); the client side is the other end of a socketpair.
"""
from __future__ import annotations

import os
import socket

import numpy as np
import pytest

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol import serving as s
from rlinkd.client_lib.protocol.spaces import Box, Discrete
from rlinkd.client_lib.transport import DIRECT_REFUSED
from rlinkd.daemon.inference.direct import MAX_FRAMES_PER_TURN, DirectConnections
from rlinkd.daemon.inference.front import Front, LanePool
from rlinkd.shm.lanes import (EVALUATE, OP_END, OP_RELEASE, OP_START, STATUS_OK, TERMINATED, LaneArea,
                              LaneLayout)
from rlinkd.shm.records import StepLayout

OBS = [0.1, 0.2, 0.3, 0.4]


@pytest.fixture(params=[True, False], ids=["native", "python"])
def direct(tmp_path, request):
    """(Every test runs with the native plain-step path -- fastpath.py, where the extension
    is built -- and without: the same behaviour either way.)"""
    area = LaneArea.create(str(tmp_path / "lanes"), LaneLayout(StepLayout.flat(4, 1, 2)), 4)
    pool = LanePool(area, Box((4,), low=-5.0, high=5.0), Discrete(2), "default")
    d = DirectConnections(Front({"default": pool}, lambda _agent: "default", 2, "inference.tcp_lanes"),
                          max_connections=2, max_message_bytes=1 << 20, idle_timeout_s=60.0,
                          read_timeout_s=5.0, native=request.param)
    yield d
    d.close_all()
    area.close()


def connect(d: DirectConnections) -> socket.socket:
    ours, theirs = socket.socketpair()
    d.add(theirs.detach())
    ours.settimeout(5.0)
    return ours


def turn(d: DirectConnections, answer: bool = True) -> list:
    """One role turn: read, (answer every pending lane), reply. Returns the lanes answered."""
    d.service(d.epoll.poll(0.02))
    answered = answer_lanes(d) if answer else []
    if d.answering:
        d.answer()
    return answered


def answer_lanes(d: DirectConnections) -> list:
    lanes = d.pools["default"].area.lanes
    idx = np.flatnonzero(lanes["req_seq"] != lanes["resp_seq"])
    lanes["action"][idx], lanes["status"][idx], lanes["weights_seq_no"][idx] = 1.0, STATUS_OK, 3
    ops = lanes["op"][idx].tolist()
    lanes["resp_seq"][idx] = lanes["req_seq"][idx]
    return ops


def requests_seen(d: DirectConnections, turns: int) -> list[tuple[int, int]]:
    """``turns`` role turns; the (op, flags) of every request published, in order."""
    lanes, seen = d.pools["default"].area.lanes, []
    for _ in range(turns):
        d.service(d.epoll.poll(0.02))
        seen += [(int(lanes["op"][i]), int(lanes["flags"][i])) for i in
                 np.flatnonzero(lanes["req_seq"] != lanes["resp_seq"])]
        answer_lanes(d)
        d.answer()
    return seen


def recv(sock: socket.socket) -> codec.Message:
    size = codec.parse_header(_exactly(sock, codec.HEADER_BYTES), 1 << 20)
    return codec.decode_body(_exactly(sock, size))


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "closed"
        data += chunk
    return data


def test_episode_messages_are_answered_one_at_a_time(direct):
    c = connect(direct)
    for msg in (s.StartEpisode("a"), s.GetAction("a", OBS), s.Step("a", 1.0, OBS)):
        c.sendall(codec.encode(msg))  # (pipelined: the role reads them all at once)
    turn(direct)
    assert recv(c) == s.EpisodeStarted("a", "default")
    assert recv(c) == s.Action("a", 1, 3)  # GET_ACTION answered in the first turn ...
    assert direct.conns[next(iter(direct.conns))].pending is None and direct.ready
    turn(direct)  # ... STEP read but published only once that reply was out
    assert recv(c) == s.Action("a", 1, 3)
    c.sendall(codec.encode(codec.Ping()))
    turn(direct)
    assert isinstance(recv(c), codec.Pong)


def test_a_client_that_closes_with_a_request_in_flight_still_has_it_answered_then_its_lane_back(direct):
    """As in the collector: the request in flight is carried out (its step trains; the reply
    goes nowhere), then the connection closes and the role ends the episode."""
    pool = direct.pools["default"]
    c = connect(direct)
    c.sendall(codec.encode(s.StartEpisode("a")) + codec.encode(s.GetAction("a", OBS)))
    turn(direct, answer=False)  # published, not answered
    c.close()
    turn(direct, answer=False)  # the EOF is seen; the request is still in flight
    assert direct.conns and len(pool.free) == 3
    assert turn(direct) == [OP_START]
    assert turn(direct) == [OP_RELEASE]  # the connection closed; the role ends the episode
    assert not direct.conns and len(pool.free) == 4 and not pool.busy


def test_a_connection_dropped_with_a_request_in_flight_drains_its_lane(direct):
    pool = direct.pools["default"]
    c = connect(direct)
    c.sendall(codec.encode(s.StartEpisode("a")) + codec.encode(s.GetAction("a", OBS)))
    turn(direct, answer=False)
    direct.close(next(iter(direct.conns)), "dropped")  # (as expire or shutdown do)
    assert pool.draining and len(pool.free) == 3
    assert turn(direct) == [OP_START]  # the old request answered; the drained lane released
    assert pool.releasing and not pool.draining
    assert turn(direct) == [OP_RELEASE]
    assert len(pool.free) == 4 and not pool.busy
    c.close()


def test_a_message_that_is_not_serving_is_an_error_to_that_client_only(direct):
    bad, good = connect(direct), connect(direct)
    bad.sendall(codec.encode(codec.GetConfig()))
    good.sendall(codec.encode(s.StartEpisode("g")))
    turn(direct)
    reply = recv(bad)
    assert isinstance(reply, codec.Error) and "not accepted on a serving connection" in reply.message
    assert bad.recv(1) == b""  # closed
    assert recv(good) == s.EpisodeStarted("g", "default")
    assert len(direct.conns) == 1 and direct.counts["direct_errors"] == 1


def test_a_bad_frame_and_a_refused_episode_close_only_their_connection(direct):
    c = connect(direct)
    c.sendall(b"12x45678{}")
    turn(direct)
    assert "bad frame header" in recv(c).message
    c = connect(direct)
    c.sendall(b"".join(codec.encode(s.StartEpisode(f"e{i}")) for i in range(3)))
    turn(direct)
    assert recv(c) == s.EpisodeStarted("e0", "default") and recv(c) == s.EpisodeStarted("e1", "default")
    assert "max_agents_per_connection" in recv(c).message


def test_the_role_refuses_connections_beyond_its_limit(direct):
    connect(direct), connect(direct)
    third = connect(direct)
    reply = recv(third)
    assert isinstance(reply, codec.Error) and reply.message.startswith(DIRECT_REFUSED)
    assert direct.counts["direct_refused"] == 1 and len(direct.conns) == 2


def test_a_flood_of_replyless_frames_is_taken_a_few_per_turn(direct):
    c = connect(direct)
    c.sendall(codec.encode(s.StartEpisode("a")) + codec.encode(s.GetAction("a", OBS)))
    turn(direct)
    recv(c), recv(c)
    c.sendall(b"".join(codec.encode(s.LogReturns("a", 1.0)) for _ in range(3 * MAX_FRAMES_PER_TURN)))
    turn(direct)
    assert direct.ready  # some left for the next turn
    for _ in range(3):
        turn(direct)
    assert not direct.ready
    assert direct.counts["direct_messages"] == 2 + 3 * MAX_FRAMES_PER_TURN


def test_a_partial_frame_past_read_timeout_closes_the_connection(direct):
    c = connect(direct)
    c.sendall(b"00000100{")
    turn(direct)
    conn = next(iter(direct.conns.values()))
    direct.expire(conn.frame_since + 4.0)
    assert direct.conns
    direct.expire(conn.frame_since + 6.0)
    assert not direct.conns


def test_frames_sent_before_the_client_closed_are_still_carried_out(direct):
    """Pipelined ENDs then close(): both episodes end as the client said (terminated), not
    truncated by the close."""
    c = connect(direct)
    c.sendall(b"".join(codec.encode(m) for m in (s.StartEpisode("a"), s.GetAction("a", OBS),
                                                 s.StartEpisode("b"), s.GetAction("b", OBS))))
    for _ in range(3):
        turn(direct)
    for _ in range(4):
        recv(c)  # (unread replies would make close() a reset, which loses what was sent)
    ends = [s.EndEpisode(e, OBS, terminated=True) for e in ("a", "b")]
    c.sendall(b"".join(codec.encode(m) for m in ends))
    c.close()
    seen = requests_seen(direct, 6)
    assert seen.count((OP_END, TERMINATED)) == 2 and not direct.conns
    assert len(direct.pools["default"].free) == 4


def test_a_client_that_closes_without_reading_its_replies_still_ends_its_episode(direct):
    """Replies to a closed client fail to send; the frames it sent before are carried out
    all the same (its END trains as terminated)."""
    c = connect(direct)
    msgs = (s.StartEpisode("a"), s.GetAction("a", OBS), s.Step("a", 1.0, OBS), s.Step("a", 1.0, OBS),
            s.EndEpisode("a", OBS, terminated=True))
    c.sendall(b"".join(codec.encode(m) for m in msgs))
    c.close()  # (nothing read)
    seen = requests_seen(direct, 8)
    assert seen[-1] == (OP_END, TERMINATED) and len(seen) == 4, seen
    assert not direct.conns and len(direct.pools["default"].free) == 4


def test_a_flood_without_replies_waits_in_the_socket_not_in_the_role(direct):
    c = connect(direct)
    c.sendall(codec.encode(s.StartEpisode("a")) + codec.encode(s.GetAction("a", OBS)))
    turn(direct)
    c.setblocking(False)
    frames = codec.encode(s.LogReturns("a", 1.0)) * 1000
    conn = next(iter(direct.conns.values()))
    for _ in range(40):
        try:
            while True:  # (the client keeps its socket full)
                c.send(frames)
        except BlockingIOError:
            pass
        turn(direct)
        assert len(conn.inbuf) < 2 * (1 << 18)  # (at most one recv past the read-ahead)


def test_the_frame_clock_stops_while_a_request_is_held(direct):
    c = connect(direct)
    c.sendall(codec.encode(s.StartEpisode("a")) + codec.encode(s.GetAction("a", OBS))
              + codec.encode(s.Step("a", 1.0, OBS)))
    turn(direct, answer=False)  # GET_ACTION held (say, on-policy); STEP waits in the buffer
    conn = next(iter(direct.conns.values()))
    direct.expire(conn.last_seen + 10.0)
    assert direct.conns, "a held request is no stalled frame"


def test_a_step_batch_of_one_step_is_published_as_a_lone_request(direct):
    """(The C client's every step: its lane carries no group, the reply is ACTIONS, the
    rewards logged before it add up, and its refusals are STEP_BATCH's.)"""
    c = connect(direct)
    lanes = direct.pools["default"].area.lanes
    c.sendall(codec.encode(s.StepBatch((s.BatchEntry("a", OBS, start=True),))))
    turn(direct)
    assert recv(c) == s.Actions([1], [3])
    c.sendall(codec.encode(s.LogReturns("a", 0.5)) + codec.encode(s.StepBatch((s.BatchEntry("a", OBS, 2.0),))))
    direct.service(direct.epoll.poll(0.02))
    lane = int(np.flatnonzero(lanes["req_seq"] != lanes["resp_seq"])[0])
    assert (lanes["group"][lane], lanes["group_size"][lane], lanes["reward"][lane]) == (0, 0, 2.5)
    answer_lanes(direct)
    direct.answer()
    assert recv(c) == s.Actions([1], [3])
    c.sendall(codec.encode(s.StepBatch((s.BatchEntry("nobody", OBS, 1.0),))))
    turn(direct)
    assert isinstance(reply := recv(c), codec.Error) and "unknown episode 'nobody'" in reply.message


def test_a_step_batch_of_one_step_keeps_the_batch_checks_and_flags(direct):
    c = connect(direct)
    lanes = direct.pools["default"].area.lanes
    c.sendall(codec.encode(s.StepBatch((s.BatchEntry("e", OBS, start=True, training_enabled=False),))))
    turn(direct)
    assert recv(c) == s.Actions([1], [3])
    c.sendall(codec.encode(s.StepBatch((s.BatchEntry("e", OBS, 1.0),))))
    direct.service(direct.epoll.poll(0.02))
    lane = int(np.flatnonzero(lanes["req_seq"] != lanes["resp_seq"])[0])
    assert lanes["flags"][lane] & EVALUATE  # (an evaluation episode's steps stay evaluation)
    answer_lanes(direct)
    direct.answer()
    assert recv(c) == s.Actions([1], [3])
    c.sendall(codec.encode(s.StartEpisode("f")) + codec.encode(s.StepBatch((s.BatchEntry("f", OBS, 1.0),))))
    turn(direct)
    assert recv(c) == s.EpisodeStarted("f", "default")
    turn(direct)
    assert isinstance(reply := recv(c), codec.Error) and "before the episode's first action" in reply.message


def test_a_batch_with_one_action_to_answer_is_published_as_lone_requests(direct):
    """(A C client's deferred END goes with its next START: only one entry wants an action,
    so no weights version must be shared and the role may serve both as lone requests; two
    entries wanting actions stay one group.)"""
    c = connect(direct)
    lanes = direct.pools["default"].area.lanes
    c.sendall(codec.encode(s.StepBatch((s.BatchEntry("a", OBS, start=True),))))
    turn(direct)
    assert recv(c) == s.Actions([1], [3])
    c.sendall(codec.encode(s.StepBatch((s.BatchEntry("a", OBS, 1.0, terminated=True),
                                        s.BatchEntry("b", OBS, start=True)))))
    direct.service(direct.epoll.poll(0.02))
    pending = np.flatnonzero(lanes["req_seq"] != lanes["resp_seq"])
    assert sorted(lanes["op"][pending].tolist()) == sorted([OP_END, OP_START])
    assert lanes["group"][pending].tolist() == [0, 0] and lanes["group_size"][pending].tolist() == [0, 0]
    answer_lanes(direct)
    direct.answer()
    assert recv(c) == s.Actions([None, 1], [-1, 3])
    c.sendall(codec.encode(s.StepBatch((s.BatchEntry("b", OBS, 1.0), s.BatchEntry("c", OBS, start=True)))))
    direct.service(direct.epoll.poll(0.02))
    pending = np.flatnonzero(lanes["req_seq"] != lanes["resp_seq"])
    assert len(set(lanes["group"][pending].tolist())) == 1 and lanes["group"][pending[0]] != 0
    assert lanes["group_size"][pending].tolist() == [2, 2]


def test_a_connection_starts_with_the_bytes_the_collector_read_and_its_ready_reply(direct):
    """``add``'s prefix (frames the collector read before the hand-over) is carried out
    before anything the socket holds; ``ready`` (it asked with SERVE_DIRECT) sends
    SERVE_DIRECT_READY before any other reply."""
    ours, theirs = socket.socketpair()
    ours.settimeout(5.0)
    prefix = codec.encode(s.StartEpisode("pre")) + codec.encode(s.GetAction("pre", OBS))[:20]
    direct.add(theirs.detach(), prefix, ready=True)
    assert isinstance(recv(ours), s.ServeDirectReady)
    ours.sendall(codec.encode(s.GetAction("pre", OBS))[20:])  # (the rest of the split frame)
    for _ in range(5):
        turn(direct)
    assert recv(ours).episode_id == "pre"  # type: ignore[attr-defined]
    reply = recv(ours)
    assert isinstance(reply, s.Action) and reply.action == 1 and reply.weights_seq_no == 3
    ours.close()


def test_the_channel_carries_a_connection_with_its_prefix_and_ready_flag():
    from rlinkd.daemon.serving import channel
    a, b = (socket.socket(fileno=fd) for fd in channel.make_pair())
    conn, _peer = socket.socketpair()
    data = b"x" * 100_000  # (more than a datagram holds)
    fds = [conn.fileno(), channel.prefix_fd(data)]
    channel.send(a, channel.ChannelMessage("direct", fds=tuple(fds), ready=True))
    got = channel.receive(b)
    assert got is not None and got.op == "direct" and got.ready and len(got.fds) == 2
    assert channel.read_prefix(got.fds[1]) == data
    os.close(fds[1])
    os.close(got.fds[0])
    for sock in (a, b, conn, _peer):
        sock.close()


def test_a_stopping_role_says_goodbye_to_every_connection(direct):
    a, b = connect(direct), connect(direct)
    a.sendall(codec.encode(s.StartEpisode("a")))
    for _ in range(3):
        turn(direct)
    assert recv(a).episode_id == "a"  # type: ignore[attr-defined]
    direct.close_all("daemon shutting down: the inference role stops")
    for sock in (a, b):
        reply = recv(sock)
        assert isinstance(reply, codec.Error) and reply.message.startswith("daemon shutting down")
        assert sock.recv(1) == b""
        sock.close()
