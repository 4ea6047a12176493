"""Test helpers: deadline-based waiting, a daemon started as a real process, raw RLlink I/O.

The raw RLlink functions use only ``socket`` and ``json`` (never client_lib), so the
tests that use them check what a client written from the seed text alone sees.
"""
from __future__ import annotations

import json
import math
import os
import signal as signals
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from rlinkd.daemon.launch import LaunchError, ServeProcess, descendants, kill_pids
from rlinkd.shm.segment import pid_alive

REPO = Path(__file__).resolve().parent.parent


def wait_for(condition, timeout_s: float, interval_s: float = 0.02, what: str = "condition"):
    """Poll ``condition()`` until it returns a truthy value; fail loudly at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


def settled(read, quiet_s: float, timeout_s: float, what: str = "a value"):
    """``read()`` once it has returned the same value for ``quiet_s`` (a count the roles
    report every status interval, with steps still in flight); fail at the deadline."""
    deadline = time.monotonic() + timeout_s
    value, since = read(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what} to settle")
        time.sleep(0.05)
        now = read()
        if now != value:
            value, since = now, time.monotonic()
    return value


# ---------------------------------------------------------------- raw RLlink (seed only)
def free_port() -> int:
    """A loopback TCP port that was free a moment ago (for a listener the test names)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(rank_main, world_size: int, deadline_s: float = 90.0) -> dict:
    """``rank_main(rank, port, results)`` in ``world_size`` spawned processes that meet on a
    free loopback port; {rank: result} from the ``(rank, result)`` each puts on ``results``.
    AssertionError at once when a rank dies, or at the deadline; every process is ended."""
    import multiprocessing
    import queue
    ctx = multiprocessing.get_context("spawn")
    results, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=rank_main, args=(rank, port, results)) for rank in range(world_size)]
    for p in procs:
        p.start()
    got, deadline = {}, time.monotonic() + deadline_s
    try:
        while len(got) < world_size:
            assert time.monotonic() < deadline, f"the ranks did not finish within {deadline_s} s"
            try:
                rank, result = results.get(timeout=0.2)
                got[rank] = result
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                assert not dead, f"a rank exited with {dead}"
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return got


def raw_send(sock: socket.socket, obj: dict) -> None:
    body = json.dumps(obj).encode("utf-8")
    sock.sendall(str(len(body)).zfill(8).encode("utf-8") + body)


def raw_recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("peer closed")
        data += chunk
    return data


def raw_recv(sock: socket.socket) -> dict:
    header = raw_recv_exactly(sock, 8)
    return json.loads(raw_recv_exactly(sock, int(header.decode("utf-8"))).decode("utf-8"))


def raw_connect(port: int, timeout_s: float = 30.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
    return sock


def peer_closed(sock: socket.socket, timeout_s: float = 5.0) -> bool:
    """True when the server closed the connection (EOF) within the timeout."""
    sock.settimeout(timeout_s)
    try:
        while True:
            if sock.recv(65536) == b"":
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


# ---------------------------------------------------------------- a real daemon
@dataclass
class DaemonProcess(ServeProcess):
    """``rlinkd serve`` (``rlinkd.daemon.launch``) plus what the process tests check at
    teardown: every child it ever had is gone and no shared-memory segment of it is left.
    ``status()`` uses the seed-only raw functions above; a stop that needs SIGKILL fails."""

    seen_children: dict = field(default_factory=dict)  # pid -> its start time (psutil)
    shm_prefixes: set = field(default_factory=set)     # "rlinkd.<pid>.<token>" seen while it ran

    def start(self, timeout_s: float = 60.0) -> DaemonProcess:
        try:
            super().start(timeout_s)
        except LaunchError as exc:
            raise AssertionError(str(exc)) from None
        self.remember_children()
        return self

    def log(self) -> str:
        return self.log_tail(20000)

    def log_mark(self) -> int:
        """The log's length now: ``log_since(mark)`` is what a shared daemon logged after it."""
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log_since(self, mark: int) -> str:
        with open(self.log_path, "rb") as log:
            log.seek(mark)
            return log.read().decode(errors="replace")

    def remember_children(self) -> set:
        """Record the daemon's current children and its segments' name prefix (to check
        none survive). A pid is remembered with its start time, and segments by their
        random token too: pids are reused (pid_max may be 32768), and a teardown must
        neither kill nor unlink what a reused pid now owns."""
        kids = set(descendants(self.pid))
        for pid in kids:
            try:
                self.seen_children.setdefault(pid, psutil.Process(pid).create_time())
            except psutil.NoSuchProcess:
                pass
        self.shm_prefixes |= {".".join(name.split(".")[:3]) for name in os.listdir("/dev/shm")
                              if name.startswith(f"rlinkd.{self.pid}.")}
        return kids

    def status(self, timeout_s: float = 10.0) -> dict:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        sock.connect(self.unix_socket)
        try:
            raw_send(sock, {"type": "STATUS"})
            return raw_recv(sock)["status"]
        finally:
            sock.close()

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def stop(self, timeout_s: float = 60.0, sig: int = signals.SIGTERM) -> int:
        """Stop the daemon, return its exit code; one that had to be killed fails the test."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.remember_children()
        code = super().stop(timeout_s, sig)
        if self.stop_timed_out:
            raise AssertionError(f"daemon did not stop within {timeout_s} s:\n{self.log()}")
        return code

    def leftover_children(self, grace_s: float = 5.0) -> list[int]:
        """Children still running (zombies count as gone) after a short grace period."""
        def running() -> list[int]:
            alive = []
            for pid, started in self.seen_children.items():
                try:
                    proc = psutil.Process(pid)
                    if proc.create_time() == started and proc.status() != psutil.STATUS_ZOMBIE:
                        alive.append(pid)
                except psutil.NoSuchProcess:
                    pass
            return alive
        deadline = time.monotonic() + grace_s
        while (alive := running()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return alive

    def leftover_segments(self, shm_dir: str = "/dev/shm") -> list[str]:
        """This daemon's segments still there: by the prefixes seen while it ran, or (none
        seen) by its pid while no process holds that pid any more."""
        prefixes = tuple(f"{p}." for p in self.shm_prefixes)
        if not prefixes and self.pid and not pid_alive(self.pid):
            prefixes = (f"rlinkd.{self.pid}.",)
        return [p for p in os.listdir(shm_dir) if prefixes and p.startswith(prefixes)]

    def kill_leftovers(self) -> None:
        kill_pids(self.leftover_children())
        for name in self.leftover_segments():
            Path("/dev/shm", name).unlink(missing_ok=True)


# ---------------------------------------------------------------- background clients
class BackgroundClient:
    """A gymnasium ``env_id`` client (CartPole by default) in a thread, until ``stop()``."""

    def __init__(self, address: str, seed: int = 0, env_id: str = "CartPole-v1", **connect_kwargs) -> None:
        import threading
        self.address, self.seed, self.env_id, self.kwargs = address, seed, env_id, connect_kwargs
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.agent = None
        self.steps = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> BackgroundClient:
        self.thread.start()
        return self

    def _run(self) -> None:
        import gymnasium as gym
        from rlinkd.client_lib import connect
        try:
            env = gym.make(self.env_id)
            self.agent = connect(self.address, **self.kwargs)
            obs, _ = env.reset(seed=self.seed)
            while not self.stop_event.is_set():
                action = self.agent.act(obs)
                obs, reward, terminated, truncated, _ = env.step(action)
                self.agent.step(reward, obs, terminated, truncated)
                self.steps += 1
                if terminated or truncated:
                    obs, _ = env.reset()
        except BaseException as exc:  # noqa: BLE001 - reported by the test through .error
            self.error = exc

    def stop(self, timeout_s: float = 60.0) -> None:
        self.stop_event.set()
        self.thread.join(timeout_s)
        if self.agent is not None:
            self.agent.link.close()


# ---------------------------------------------------------------- learning runs
def play_env(address: str, returns: list[float], stop, seed: int, env_id: str = "CartPole-v1",
             **connect_kwargs) -> None:
    """A client_lib agent on gymnasium ``env_id`` until ``stop`` is set; every episode's
    return into ``returns``."""
    import gymnasium as gym
    from rlinkd.client_lib import connect
    agent = connect(address, **connect_kwargs)
    env = gym.make(env_id)
    obs, _ = env.reset(seed=seed)
    total = 0.0
    while not stop.is_set():
        obs, reward, terminated, truncated, _ = env.step(agent.act(obs))
        agent.step(reward, obs, terminated, truncated)
        total += reward
        if terminated or truncated:
            returns.append(total)
            total, (obs, _) = 0.0, env.reset()
    agent.close()


def mean_last(returns: list[float], n: int = 20) -> float:
    """Mean of the last ``n`` returns; -inf before there are ``n``."""
    return sum(returns[-n:]) / n if len(returns) >= n else -math.inf


def learn_over_both_transports(d, target: float, budget_s: float, env_id: str = "CartPole-v1",
                               last_n: int = 20) -> dict[str, list[float]]:
    """One TCP and one shared-memory client of ``env_id`` on daemon ``d`` until either's
    mean return of its last ``last_n`` episodes reaches ``target`` (AssertionError after
    ``budget_s``); their episode returns."""
    addresses = {"tcp": f"tcp://127.0.0.1:{d.port}", "shm": f"shm:{d.state_dir}"}
    return learn_with_clients(addresses, target, budget_s, env_id, last_n)


def learn_with_clients(addresses: dict[str, str], target: float, budget_s: float,
                       env_id: str = "CartPole-v1", last_n: int = 20,
                       **connect_kwargs) -> dict[str, list[float]]:
    """One client_lib client of ``env_id`` per named address (``connect_kwargs`` go to
    ``connect``) until one's mean return of its last ``last_n`` episodes reaches ``target``
    (AssertionError after ``budget_s``); their episode returns by name."""
    import threading
    returns: dict[str, list[float]] = {name: [] for name in addresses}
    stop = threading.Event()
    threads = [threading.Thread(target=play_env, args=(address, returns[name], stop, i, env_id),
                                kwargs=connect_kwargs)
               for i, (name, address) in enumerate(addresses.items())]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: max(mean_last(r, last_n) for r in returns.values()) >= target, budget_s,
                 what=f"a client's mean return of {target}: "
                      f"{[round(mean_last(r, last_n), 1) for r in returns.values()]}")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    return returns


def concurrently(calls: dict[str, object]) -> dict[str, object]:
    """Every callable of ``calls`` in its own thread at once (each bounded by its own
    deadline); their results by name once all have returned. The first failure, by the
    order of ``calls``, is raised again after every call has ended."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = {name: pool.submit(call) for name, call in calls.items()}
        return {name: future.result() for name, future in futures.items()}
