"""sd_notify messages, received on a real datagram socket passed as NOTIFY_SOCKET."""
from __future__ import annotations

import glob
import signal
import socket
import struct
import threading

import gymnasium as gym
import pytest

from rlinkd.client_lib import run_env
from rlinkd.shm.board import WeightsBoard
from tests.helpers import wait_for

pytestmark = pytest.mark.process


def board_seq_no(pid: int) -> int | None:
    """The weights_seq_no on the default policy's weights board of the daemon ``pid`` (-1
    before the first publish), None when it has no board."""
    paths = glob.glob(f"/dev/shm/rlinkd.{pid}.*.board.default")
    if len(paths) != 1:
        return None
    board = WeightsBoard.attach(paths[0])
    try:
        return board.latest_seq_no()
    finally:
        board.close()


class NotifyListener:
    """Collects notifications. When READY=1 arrives it reads the sender's weights board
    before taking the next datagram, so ``board_seq_no`` in that message is what a
    client connecting right then would get (not what is there a little later)."""

    def __init__(self, path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # the sender's pid
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[dict] = []
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while self.running:
            try:
                data, ancillary, _, _ = self.sock.recvmsg(65536, socket.CMSG_SPACE(12))
            except TimeoutError:
                continue
            msg = dict(line.split("=", 1) for line in data.decode().splitlines())
            msg["sender_pid"] = sender_pid(ancillary)
            if msg.get("READY") == "1":
                msg["board_seq_no"] = board_seq_no(msg["sender_pid"])
            self.messages.append(msg)

    def index(self, key: str, value: str | None = None, after: int = -1) -> int:
        for i, msg in enumerate(self.messages):
            if i > after and key in msg and (value is None or msg[key] == value):
                return i
        return -1

    def close(self) -> None:
        self.running = False
        self.thread.join()
        self.sock.close()


def sender_pid(ancillary) -> int:
    """The pid in an SCM_CREDENTIALS message (struct ucred: pid, uid, gid)."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            return struct.unpack("iII", data[:12])[0]
    raise AssertionError("notification without sender credentials")


def test_ready_status_watchdog_reload_and_stopping(daemon_factory, tmp_path):
    listener = NotifyListener(tmp_path / "notify.sock")
    config = tmp_path / "rlinkd.toml"
    config.write_text("[ppo]\nlr = 0.001\n")
    d = daemon_factory("--config", str(config), env={
        "NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "1000000"})
    ready = wait_for(lambda: listener.index("READY", "1") + 1, 10, what="READY=1") - 1
    assert {msg["sender_pid"] for msg in listener.messages} == {d.pid}  # NotifyAccess=main
    assert listener.messages[ready]["board_seq_no"] == 0  # READY only once the first weights are out
    wait_for(lambda: listener.index("WATCHDOG", "1") >= 0, 10, what="WATCHDOG=1")
    status = wait_for(lambda: listener.index("STATUS", after=ready) + 1, 10, what="STATUS") - 1
    assert "steps/s" in listener.messages[status]["STATUS"]
    d.signal(signal.SIGHUP)
    reloading = wait_for(lambda: listener.index("RELOADING", "1") + 1, 10, what="RELOADING") - 1
    assert int(listener.messages[reloading]["MONOTONIC_USEC"]) > 0
    wait_for(lambda: listener.index("READY", "1", after=reloading) >= 0, 10, what="READY again")
    assert d.stop() == 0
    assert listener.index("STOPPING", "1", after=reloading) >= 0
    listener.close()


def test_ready_comes_with_the_checkpoint_loaded(daemon_factory, tmp_path):
    d = daemon_factory(name="resume")
    run_env(gym.make("CartPole-v1"), f"tcp://127.0.0.1:{d.port}", steps=1024, seed=0)
    trained = wait_for(lambda: (s := d.status())["weights_seq_no"] >= 2 and s, 30, what="training")
    assert d.stop() == 0  # final checkpoint
    listener = NotifyListener(tmp_path / "notify.sock")
    d.env = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock")}
    d.proc = None
    d.start()
    ready = wait_for(lambda: listener.index("READY", "1") + 1, 30, what="READY=1") - 1
    status = d.status()  # no client is connected: nothing has trained since READY
    resumed = status["last_checkpoint"]["weights_seq_no"]
    assert resumed >= trained["weights_seq_no"]
    # at READY the resumed weights were already published, not fresh ones (0) nor none (-1)
    assert listener.messages[ready]["board_seq_no"] == resumed
    assert status["weights_seq_no"] == resumed
    assert status["env_steps"] == 1024
    listener.close()
