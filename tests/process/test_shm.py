"""Shared-memory clients against a real daemon: training, cleanup, mixed transports."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import gymnasium as gym
import pytest

from rlinkd.client_lib import connect, run_env
from rlinkd.client_lib.shm_client import receive_ring_fd
from rlinkd.shm.records import FINAL_OBS, TERMINATED, StepLayout
from rlinkd.shm.ring import StepRing
from tests.helpers import REPO, BackgroundClient, raw_recv, raw_send, wait_for

pytestmark = pytest.mark.process


def shm_segments(daemon) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"rlinkd.{daemon.pid}."))


def collector_pid(daemon) -> int:
    return daemon.status()["children"]["collector"]["pid"]


def client_rings(daemon) -> set[str]:
    """Names of the client-ring memfds the collector still holds (descriptor or mapping)."""
    pid = collector_pid(daemon)
    seen = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            seen.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:
            continue  # closed meanwhile
    with open(f"/proc/{pid}/maps") as maps:
        seen += [line.split(None, 5)[-1] for line in maps if "/memfd:" in line]
    return {text.split("memfd:", 1)[1].strip().removesuffix(" (deleted)")
            for text in seen if "memfd:" in text and ".client-" in text}


def attach_raw(daemon, sock: socket.socket) -> tuple[dict, int]:
    """ATTACH with raw frames (seed-only framing), then the ring descriptor that follows."""
    sock.connect(daemon.unix_socket)
    raw_send(sock, {"type": "ATTACH", "pid": os.getpid()})
    attached = raw_recv(sock)
    assert attached["type"] == "ATTACHED", attached
    return attached, receive_ring_fd(sock)


def test_shm_client_trains_and_its_ring_is_reclaimed(shared_daemon):
    daemon, before = shared_daemon, shared_daemon.status()
    addr = f"shm:{daemon.state_dir}"
    agent = connect(addr)
    assert type(agent.link).__name__ == "ShmLink"
    assert not any(".client-" in n for n in shm_segments(daemon))  # no file anyone could open
    assert len(client_rings(daemon)) == 1
    stats = run_env(gym.make("CartPole-v1"), agent, steps=2 * agent.env_steps_per_sample, seed=0)
    assert stats.steps == 2 * agent.env_steps_per_sample
    # on-policy: each sample trained before continuing
    assert agent.weights_seq_no >= before["weights_seq_no"] + 2, (before, agent.weights_seq_no)
    agent.close()
    wait_for(lambda: not client_rings(daemon), 10, what="ring closed by the collector after close")
    assert daemon.status()["env_steps"] == before["env_steps"] + 2 * agent.env_steps_per_sample


def test_sigkilled_shm_client_segments_are_reclaimed(shared_daemon):
    daemon, before = shared_daemon, shared_daemon.status()
    code = ("import gymnasium as gym, sys; from rlinkd.client_lib import run_env; "
            f"run_env(gym.make('CartPole-v1'), 'shm:{daemon.state_dir}', steps=10**9)")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO)
    wait_for(lambda: daemon.status()["env_steps"] >= before["env_steps"] + 1024, 60, what="shm client training")
    assert client_rings(daemon)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_for(lambda: not client_rings(daemon), 10, what="ring reclaimed after SIGKILL")
    steps = daemon.status()["env_steps"]
    # Nothing of the dead client is counted any more, while the drain loop keeps running:
    # a new client trains for two samples, and the count grows by exactly its steps.
    agent = connect(f"shm:{daemon.state_dir}")
    n = 2 * agent.env_steps_per_sample
    assert run_env(gym.make("CartPole-v1"), agent, steps=n, seed=1).steps == n
    agent.close()
    assert daemon.status()["env_steps"] == steps + n and daemon.proc.poll() is None


def test_ring_of_a_client_that_attaches_and_leaves_without_sampling_is_reclaimed(shared_daemon):
    daemon = shared_daemon
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    attached, ring_fd = attach_raw(daemon, sock)
    os.close(ring_fd)
    assert client_rings(daemon) == {attached["ring_name"]}
    sock.close()
    wait_for(lambda: not client_rings(daemon), 10, what="ring closed after an attach-only client left")


def test_ring_reclaimed_when_the_attaching_pid_is_gone_though_its_socket_lives(shared_daemon, tmp_path):
    """A client forks and exits: the child keeps the socket open, the ring still goes."""
    daemon = shared_daemon
    mark = daemon.log_mark()
    child_pid_file = tmp_path / "child.pid"
    code = ("import os, time; from rlinkd.client_lib import connect; "
            f"agent = connect('shm:{daemon.state_dir}'); "
            "pid = os.fork()\n"
            "if pid == 0:\n    time.sleep(60); os._exit(0)\n"
            f"open({str(child_pid_file)!r}, 'w').write(str(pid)); os._exit(0)")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)
    child = int(child_pid_file.read_text())
    try:
        assert os.path.exists(f"/proc/{child}")  # the socket is still open in the child
        wait_for(lambda: not client_rings(daemon), 10, what="ring reclaimed after the attaching pid exited")
        assert '"shm_client_gone"' in daemon.log_since(mark)
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_client_cannot_shrink_its_ring_and_the_collector_keeps_running(shared_daemon):
    """The ring is a sealed memfd: ftruncate fails with EPERM (the ERROR the client gets),
    whoever holds it, and the collector reads it as before. Before the seals, the
    collector died of SIGBUS here and was restarted."""
    daemon = shared_daemon
    before = daemon.status()["children"]["collector"]
    good = BackgroundClient(f"shm:{daemon.state_dir}", seed=2).start()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    try:
        wait_for(lambda: good.steps > 0 or good.error, 60, what="the well-behaved client training")
        attached, ring_fd = attach_raw(daemon, sock)
        for size in (0, 4096, os.fstat(ring_fd).st_size + 4096):
            with pytest.raises(PermissionError):
                os.ftruncate(ring_fd, size)
        # a second descriptor, opened through the collector's own fd table, is no way round
        sealed = [f"/proc/{before['pid']}/fd/{fd}" for fd in os.listdir(f"/proc/{before['pid']}/fd")
                  if attached["ring_name"] in os.readlink(f"/proc/{before['pid']}/fd/{fd}")]
        assert sealed  # the descriptor Python's mmap keeps beside the collector's mapping
        reopened = os.open(sealed[0], os.O_RDWR)
        with pytest.raises(PermissionError):
            os.ftruncate(reopened, 0)
        os.close(reopened)
        ring = StepRing.attach_fd(ring_fd, attached["ring_name"], StepLayout.from_json(attached["layout"]))
        episode = ring.layout.empty(4)  # 3 steps of a CartPole episode, then its final obs
        episode["reward"][:3] = 1.0
        episode["flags"][3] = FINAL_OBS | TERMINATED
        assert ring.write_batch(episode) == 4
        raw_send(sock, {"type": "SAMPLE_READY", "env_steps": 3, "get_state": False})
        assert raw_recv(sock)["type"] == "WEIGHTS_READY"  # read and accepted: no ERROR
        assert ring.readable_records() == 0  # the collector consumed all four records
        ring.close()
        steps = good.steps
        wait_for(lambda: good.steps > steps + 100 or good.error, 60, what="the good client going on")
        assert good.error is None, good.error
        after = daemon.status()["children"]["collector"]
        assert (after["pid"], after["restarts"]) == (before["pid"], before["restarts"]), (before, after)
    finally:
        sock.close()
        good.stop()


def test_auto_prefers_shm_locally_and_tcp_and_shm_mix(shared_daemon):
    daemon, before = shared_daemon, shared_daemon.status()
    agent = connect(f"auto:{daemon.state_dir}")
    assert type(agent.link).__name__ == "ShmLink"
    tcp = connect(f"tcp://127.0.0.1:{daemon.port}")
    env_a, env_b = gym.make("CartPole-v1"), gym.make("CartPole-v1")
    run_env(env_a, agent, steps=agent.env_steps_per_sample)
    run_env(env_b, tcp, steps=tcp.env_steps_per_sample)
    steps = before["env_steps"] + 2 * agent.env_steps_per_sample
    status = wait_for(lambda: (s := daemon.status())["env_steps"] >= steps and s, 10,
                      what="both transports ingested")
    assert status["env_steps"] == steps, (before, status)
    agent.close()
    tcp.close()


def test_auto_without_a_local_daemon_falls_back_to_tcp(tmp_path):
    from rlinkd.client_lib.links import TcpLink
    from rlinkd.client_lib.shm_client import open_local_link
    link = open_local_link(f"auto:{tmp_path}")  # no daemon.json there: nothing runs locally
    assert isinstance(link, TcpLink)
    assert (link.address.host, link.address.port) == ("127.0.0.1", 5555)


def test_cli_client_over_shm_found_through_the_state_dir(shared_daemon):
    daemon, before = shared_daemon, shared_daemon.status()
    mark = daemon.log_mark()
    result = subprocess.run(
        [sys.executable, "-m", "rlinkd.daemon.cli", "client", "--connect", "shm", "--state-dir",
         str(daemon.state_dir), "--steps", "600", "--seed", "3"],
        capture_output=True, text=True, timeout=120, cwd=REPO, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    done = json.loads(result.stdout.splitlines()[-1])
    assert done["event"] == "done" and done["steps"] == 600
    wait_for(lambda: daemon.status()["env_steps"] == before["env_steps"] + 600, 10,
             what="the daemon counted the client's steps")
    assert '"shm_client_attached"' in daemon.log_since(mark)
