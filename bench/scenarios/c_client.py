"""The C client's CartPole loop: env steps/s with server- and client-side inference, beside Python's.

    python -m bench.scenarios.c_client [--runs 3] [--seconds 15] [--quick] [--out FILE]

Per run, one daemon (CartPole-v1, PPO with ``sampling.force_on_policy = false``: clients never
wait for an update, so the figures are the serving path's, not the learner's), then in turn
for ``--seconds`` each: the C example (client_lib/c/examples/cartpole.c, built here with -O2)
with 1 and with 8 agents over TCP, the Unix socket and shared-memory lanes (server-side
actions) and with client-side inference over shared memory (``--inference client``: the MLP
run in the C process on the board's weights, steps written into its ring), and the Python
client_lib client the same ways (``connect(..., inference="server")`` over TCP and shared
memory, the default client-side inference over shared memory; one agent, and a vector of 8).
Reports env steps/s (medians over runs), and the round-trip
limits measured in the same run (bench.scenarios.serving: a blocking shared-memory round trip,
a TCP + orjson round trip; their p50 in steps/s is what one agent could at most reach).
``--many N`` instead: N single-agent C clients at once against a daemon that does not train
(the serving benchmark's settings), over shared-memory lanes and over TCP, training clients
(their steps recorded and ingested as for training) and evaluation clients (``--evaluate 1``:
nothing recorded, the serving path alone): the inference role's actions/s with clients whose
own CPU per action is small (issue 12's 64-client targets), with the role's mean batch and
CPU per 1,000 actions and where the 2 cores went (role, other roles, clients), beside the
physical limits of that pattern measured in the same run: bench/limits/fanin.c (N C
processes sleeping on their own eventfd, one C server answering all pending words per pass
and ringing each sleeper; no policy, no Python), what one Python ``os.write`` to the eventfd
of a sleeping process costs the writer (the role rings every answered client that sleeps),
bench/limits/tcp_fanin.c (N C processes in lockstep over loopback TCP, one C epoll server),
and a Python epoll server doing only the recv and send per message against those clients.
Writes bench/results/c_client.json (``--many``: c_client_many.json).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from bench.harness.common import REPO, median_range, write_result
from rlinkd.daemon.launch import ServeProcess

C_DIR = REPO / "client_lib" / "c"


def build(out: Path) -> Path:
    subprocess.run(["make", "-s", "-C", str(C_DIR), f"OUT={out}", "all"], check=True, timeout=300)
    return out / "cartpole"


def c_rate(binary: Path, address: str, agents: int, seconds: float, *extra: str) -> float:
    proc = subprocess.run([str(binary), address, "--agents", str(agents), "--target", "1e9",
                           "--max-seconds", str(seconds), *extra], capture_output=True, text=True,
                          timeout=seconds + 60)
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["steps_per_s"])


def python_rate(address: str, agents: int, seconds: float, inference: str = "server") -> float:
    import gymnasium as gym
    from rlinkd.client_lib import connect, connect_vector
    if agents == 1:
        agent, env = connect(address, inference=inference), gym.make("CartPole-v1")
        obs, _ = env.reset(seed=0)
        steps, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < seconds:
            obs, reward, term, trunc, _ = env.step(agent.act(obs))
            agent.step(reward, obs, term, trunc)
            obs = env.reset()[0] if term or trunc else obs
            steps += 1
        agent.close()
        return steps / (time.monotonic() - t0)
    envs = gym.make_vec("CartPole-v1", num_envs=agents, vectorization_mode="sync")
    vec = connect_vector(address, agents, inference=inference)
    obs, _ = envs.reset(seed=0)
    steps, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        obs, reward, term, trunc, _ = envs.step(vec.act(obs))
        vec.step(reward, obs, term, trunc)
        steps += agents
    vec.close()
    return steps / (time.monotonic() - t0)


def one_run(binary: Path, seconds: float) -> dict[str, float]:
    state = Path(tempfile.mkdtemp(prefix="rlinkd-cbench-"))
    daemon = ServeProcess(state, ["--set", "sampling.force_on_policy=false"])
    try:
        daemon.start()
        tcp, unix = f"tcp://127.0.0.1:{daemon.port}", f"unix://{daemon.unix_socket}"
        shm = f"shm://{daemon.unix_socket}"
        rates = {}
        for transport, address in (("tcp", tcp), ("unix", unix), ("shm", shm)):
            for agents in (1, 8):
                rates[f"c {transport} x{agents}"] = c_rate(binary, address, agents, seconds)
        for agents in (1, 8):
            rates[f"c shm-client x{agents}"] = c_rate(binary, shm, agents, seconds, "--inference", "client")
        for transport, address in (("tcp", tcp), ("shm", unix)):  # (python: unix:// = lanes)
            for agents in (1, 8):
                rates[f"python {transport} x{agents}"] = python_rate(address, agents, seconds)
        for agents in (1, 8):
            rates[f"python shm-client x{agents}"] = python_rate(unix, agents, seconds, "client")
        return rates
    finally:
        daemon.stop()
        shutil.rmtree(state, ignore_errors=True)


def limit_rate(name: str, out_dir: Path, clients: int, seconds: float) -> float:
    """Round trips/s of the limit program bench/limits/``name``.c (built into ``out_dir``)
    with ``clients`` client processes for ``seconds``: ``fanin`` (sleeping processes, shared
    memory + eventfd, one C server) or ``tcp_fanin`` (lockstep over loopback TCP, one
    single-threaded C epoll server); no policy, no JSON, no Python."""
    exe = out_dir / name
    subprocess.run(["cc", "-O2", "-std=c11", "-o", str(exe), str(REPO / "bench" / "limits" / f"{name}.c")],
                   check=True, timeout=120)
    done = subprocess.run([str(exe), str(clients), str(seconds)], capture_output=True, text=True,
                          check=True, timeout=seconds + 60)
    return float(json.loads(done.stdout)["round_trips_per_s"])


def python_tcp_echo(out_dir: Path, clients: int, seconds: float) -> float:
    """Round trips/s of a Python epoll server that only reads each frame and sends a canned
    reply (one recv and one send per message, as the role), against tcp_fanin's C clients:
    the floor of any single-process Python TCP server on this machine."""
    request, reply = 8 + 150, b"r" * (8 + 70)  # (tcp_fanin.c's REQUEST_BYTES, REPLY_BYTES)
    listener = socket.create_server(("127.0.0.1", 0))
    clients_proc = subprocess.Popen([str(out_dir / "tcp_fanin"), str(clients), str(seconds + 2.0),
                                     str(listener.getsockname()[1])])
    ep, conns = select.epoll(), {}
    try:
        for _ in range(clients):
            sock, _ = listener.accept()
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            conns[sock.fileno()] = [sock, 0]
            ep.register(sock.fileno(), select.EPOLLIN)
        answered, start, end = 0, time.perf_counter() + 0.5, time.perf_counter() + 0.5 + seconds
        while (now := time.perf_counter()) < end:
            for fd, _ev in ep.poll(0.1):
                conn = conns[fd]
                conn[1] += len(conn[0].recv(1 << 16))
                while conn[1] >= request:
                    conn[1] -= request
                    conn[0].send(reply)
                    answered += now >= start
        return answered / seconds
    finally:
        clients_proc.wait(timeout=seconds + 60)
        for sock, _ in conns.values():
            sock.close()
        listener.close()
        ep.close()


def wake_cost_us(processes: int, rounds: int = 200) -> float:
    """Microseconds one Python ``os.write`` to an eventfd costs the writer when a process
    sleeps on it (the inference role's ring of a sleeping client), ``processes`` at a time."""
    fds = [os.eventfd(0, 0) for _ in range(processes)]
    pids = []
    for fd in fds:
        pid = os.fork()
        if pid == 0:  # (a child: sleep on its eventfd until killed)
            while True:
                os.read(fd, 8)
        pids.append(pid)
    try:
        one, total = (1).to_bytes(8, "little"), 0.0
        time.sleep(0.5)
        for _ in range(rounds):
            time.sleep(0.005)  # (every child asleep again)
            t0 = time.perf_counter()
            for fd in fds:
                os.write(fd, one)
            total += time.perf_counter() - t0
        return total / rounds / processes * 1e6
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        for fd in fds:
            os.close(fd)


def many_c(binary: Path, clients: int, seconds: float) -> dict[str, dict]:
    """``clients`` C processes (one agent each) per transport at once; the role's counters;
    the fan-in limit of as many sleeping processes."""
    from bench.scenarios.serving import NO_TRAINING
    limit_s = min(seconds, 5.0)
    out: dict[str, dict] = {"limit": {"round_trips_per_s": round(limit_rate("fanin", binary.parent, clients,
                                                                            limit_s)),
                                      "python_wake_us": round(wake_cost_us(clients), 1),
                                      "tcp_round_trips_per_s": round(limit_rate("tcp_fanin", binary.parent, clients,
                                                                                limit_s)),
                                      "python_tcp_echo_per_s": round(python_tcp_echo(binary.parent, clients,
                                                                                     limit_s))}}
    state = Path(tempfile.mkdtemp(prefix="rlinkd-cmany-"))
    with ServeProcess(state / "state", NO_TRAINING) as daemon:
        time.sleep(2.0)
        for transport, evaluate in (("shm", False), ("tcp", False), ("shm", True), ("tcp", True)):
            address = f"shm://{daemon.unix_socket}" if transport == "shm" else f"tcp://127.0.0.1:{daemon.port}"
            key = f"{transport} evaluate" if evaluate else transport
            out[key] = many_c_once(daemon, binary, address, clients, seconds, evaluate)
    shutil.rmtree(state, ignore_errors=True)
    return out


def many_c_once(daemon: ServeProcess, binary: Path, address: str, clients: int, seconds: float,
                evaluate: bool) -> dict:
    """One measurement of ``many_c``: actions/s, the role's mean batch and CPU per 1,000
    actions, and where the 2 cores went (the role, the daemon's other roles: recording
    and ingesting the steps for training, the clients)."""
    before, daemon_cpu0 = daemon.status()["inference"], _tree_cpu_s(daemon.proc.pid)
    clients_cpu0 = _children_cpu_s()
    procs = [subprocess.Popen([str(binary), address, "--agents", "1", "--target", "1e9", "--max-seconds",
                               str(seconds), "--evaluate", str(int(evaluate))], stdout=subprocess.PIPE, text=True)
             for _ in range(clients)]
    rates = [json.loads(p.communicate(timeout=seconds + 60)[0].strip().splitlines()[-1])["steps_per_s"]
             for p in procs]
    clients_cpu = _children_cpu_s() - clients_cpu0
    time.sleep(1.2)  # (one more status report from the role)
    after, daemon_cpu = daemon.status()["inference"], _tree_cpu_s(daemon.proc.pid) - daemon_cpu0
    actions = after["actions"] - before.get("actions", 0)
    batches = after["batches"] - before.get("batches", 0)
    role_cpu = after["cpu_s"] - before.get("cpu_s", 0)
    return {"actions_per_s": round(sum(rates)),
            "mean_batch_size": round(actions / max(batches, 1), 1),
            "inference_cpu_ms_per_1000_actions": round(1e6 * role_cpu / max(actions, 1), 1),
            "cpu_cores": {"inference": round(role_cpu / seconds, 2),
                          "other_roles": round((daemon_cpu - role_cpu) / seconds, 2),
                          "clients": round(clients_cpu / seconds, 2)}}


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and its descendants so far."""
    import psutil
    total = 0.0
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.Error:  # (gone meanwhile)
            continue
        total += times.user + times.system
    return total


def _children_cpu_s() -> float:
    """CPU seconds of this process's waited-for children (the client processes)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main_many(args, binary: Path) -> int:
    runs = [many_c(binary, args.many, args.seconds) for _ in range(args.runs)]
    result = {"clients": args.many, "seconds": args.seconds, "runs": runs,
              "actions_per_s": {t: median_range([r[t]["actions_per_s"] for r in runs], 0)
                                for t in runs[0] if t != "limit"},
              "limit_round_trips_per_s": median_range([r["limit"]["round_trips_per_s"] for r in runs], 0),
              "python_wake_us": median_range([r["limit"]["python_wake_us"] for r in runs])}
    path = write_result("c_client_many", result, args.out)
    for t, m in result["actions_per_s"].items():
        print(f"{args.many} C clients, {t}: {m['median']:,.0f} actions/s ({m['min']:,.0f} – {m['max']:,.0f}); "
              f"last run {runs[-1][t]}")
    lim, last = result["limit_round_trips_per_s"], runs[-1]["limit"]
    print(f"limit ({args.many} sleeping C processes, C server, no policy): {lim['median']:,.0f} round trips/s; "
          f"waking a sleeping process from Python: {result['python_wake_us']['median']:.1f} us; over TCP "
          f"(last run): C server {last['tcp_round_trips_per_s']:,} round trips/s, Python echo server "
          f"{last['python_tcp_echo_per_s']:,}")
    print(f"wrote {path}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="daemons (each measures every client)")
    ap.add_argument("--seconds", type=float, default=15.0, help="seconds per client measurement")
    ap.add_argument("--quick", action="store_true", help="one run of 3 s each")
    ap.add_argument("--many", type=int, default=0, help="instead: this many single-agent C clients at once")
    ap.add_argument("--out", help="result file (default: bench/results/c_client.json)")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.seconds = 1, 3.0
    from bench.scenarios.serving import shm_round_trip, tcp_round_trip
    binary = build(Path(tempfile.mkdtemp(prefix="rlinkd-cbuild-")))
    if args.many:
        return main_many(args, binary)
    runs = [one_run(binary, args.seconds) for _ in range(args.runs)]
    limits_us = {"shm_round_trip": shm_round_trip(2000), "tcp_round_trip": tcp_round_trip(2000)}
    result = {"seconds": args.seconds, "runs": runs, "limits_us": limits_us,
              "env_steps_per_s": {k: median_range([r[k] for r in runs], 0) for k in runs[0]}}
    path = write_result("c_client", result, args.out)
    for name, m in result["env_steps_per_s"].items():
        print(f"{name:>14}: {m['median']:>8,.0f} env steps/s ({m['min']:,.0f} – {m['max']:,.0f})")
    for name, p in limits_us.items():
        print(f"{name:>14}: p50 {p['p50']:.0f} us = at most {1e6 / p['p50']:,.0f} round trips/s")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
