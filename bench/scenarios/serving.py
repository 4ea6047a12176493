"""Server-side actions: latency, throughput and time to solve, beside the physical limits.

    python -m bench.scenarios.serving [--runs 3] [--clients 64] [--quick] [--out FILE]

In one run, on this machine:
- physical limits: a blocking shared-memory round trip between two processes (a request
  word in shared memory plus an eventfd doorbell each way, as the lanes do), a TCP loopback
  round trip of an RLlink-framed orjson message, one onnxruntime and one numpy batch-1
  forward pass of the CartPole policy network;
- one client, one action at a time: p50/p99 of ``act`` + ``step`` with
  ``connect(..., inference="server")`` over shared memory and over TCP (a direct connection,
  and one through the collector) (a daemon that does not train during the measurement);
- N client processes at once: actions/s over shared memory and TCP, the inference role's
  batch sizes and CPU per 1,000 actions (from ``rlinkd status``);
- the same N agents as ``connect_vector(..., inference="server")`` copies, in 1 and in 4
  processes (one request group or STEP_BATCH per act for all of a process's copies);
- CartPole-v1 to mean return 450: ``rlinkd demo`` with client-side inference (the default
  demo) against ``--inference server`` (shared memory and TCP, one env per client and
  vector clients of 4), alternating, ``--runs`` seeds.
Writes bench/results/serving.json.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import orjson

from bench.harness.common import median_range, percentiles, write_result
from bench.harness.demo import demo_command, demo_summary
from rlinkd.daemon.launch import ServeProcess

OBS = np.array([0.01, 0.02, 0.03, 0.04], np.float32)
NO_TRAINING = ["--set", "sampling.train_batch_size=100000000", "--set", "ppo.minibatch_size=100",
               "--set", "server.max_connections=512"]


# ---------------------------------------------------------------- physical limits
def _echo_lane(area_path: str, req_fd: int, resp_fd: int, n: int) -> None:
    from rlinkd.shm.doorbell import Doorbell
    buf = np.memmap(area_path, np.uint32, "r+", shape=(16,))
    req, resp = Doorbell(req_fd), Doorbell(resp_fd)
    for i in range(1, n + 1):
        while buf[0] != i:
            req.wait(1.0)
        buf[1] = i
        resp.ring()


def shm_round_trip(n: int) -> dict:
    """Blocking round trips through a shared word and two eventfds (no spinning)."""
    from rlinkd.shm.doorbell import Doorbell
    path = tempfile.mktemp(prefix="rlinkd-bench-rt.", dir="/dev/shm")
    np.zeros(16, np.uint32).tofile(path)
    req, resp = Doorbell.create(), Doorbell.create()
    child = mp.get_context("fork").Process(target=_echo_lane, args=(path, req.fileno(), resp.fileno(), n))
    child.start()
    buf = np.memmap(path, np.uint32, "r+", shape=(16,))
    lat = []
    for i in range(1, n + 1):
        t0 = time.perf_counter()
        buf[0] = i
        req.ring()
        while buf[1] != i:
            resp.wait(1.0)
        lat.append(time.perf_counter() - t0)
    child.join(10)
    os.unlink(path)
    return percentiles([x * 1e6 for x in lat])


def _echo_tcp(server: socket.socket, n: int) -> None:
    conn, _ = server.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(n):
        size = int(_read(conn, 8))
        msg = orjson.loads(_read(conn, size))
        body = orjson.dumps({"type": "ACTION", "episode_id": msg["episode_id"], "action": 1})
        conn.sendall(b"%08d" % len(body) + body)
    conn.close()


def _read(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        data += conn.recv(n - len(data))
    return data


def tcp_round_trip(n: int) -> dict:
    """RLlink-framed orjson STEP -> ACTION round trips to a blocking echo server (a thread
    in another process would be the same on this 2-core machine; a thread keeps it simple)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    t = threading.Thread(target=_echo_tcp, args=(server, n), daemon=True)
    t.start()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        body = orjson.dumps({"type": "STEP", "episode_id": "e", "reward": 1.0, "observation": OBS},
                            option=orjson.OPT_SERIALIZE_NUMPY)
        sock.sendall(b"%08d" % len(body) + body)
        orjson.loads(_read(sock, int(_read(sock, 8))))
        lat.append(time.perf_counter() - t0)
    sock.close()
    server.close()
    return percentiles([x * 1e6 for x in lat])


def forward_costs(n: int) -> dict:
    from rlinkd.daemon import policies
    from rlinkd.daemon.config import load_config
    from rlinkd.daemon.inference.backend import numpy_forward, onnx_forward
    d = policies.policy_defs(load_config(None, []))["default"]
    flat = np.random.default_rng(0).normal(size=d.spec.n_params()).astype(np.float32) * 0.1
    flat[:] = np.abs(flat) + 0.1  # positive normaliser std
    obs = {"": OBS[None]}
    out = {}
    for name, make in (("onnxruntime", onnx_forward), ("numpy", numpy_forward)):
        fwd = make(d.spec, flat)
        fwd(obs)
        lat = []
        for _ in range(n):
            t0 = time.perf_counter()
            fwd(obs)
            lat.append(time.perf_counter() - t0)
        out[name] = percentiles([x * 1e6 for x in lat])
    return out


# ---------------------------------------------------------------- rlinkd
def one_client_latency(d: ServeProcess, transport: str, n: int) -> dict:
    """``transport``: "shm" (lanes) or "tcp" (a serving connection, answered by the
    inference role)."""
    from rlinkd.client_lib.served import ServedAgent, served_link
    addr = f"unix://{d.unix_socket}" if transport == "shm" else f"tcp://127.0.0.1:{d.port}"
    link = served_link(addr, token=None, reconnect_timeout_s=10.0, ssl_context=None, policy=None)
    agent = ServedAgent(link)
    agent.act(OBS)
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        agent.step(1.0, OBS, False, False)
        agent.act(OBS)
        lat.append(time.perf_counter() - t0)
    agent.close()
    return percentiles([x * 1e6 for x in lat[n // 10:]])


def _worker(addr: str, secs: float, q, start) -> None:
    from rlinkd.client_lib import connect
    agent = connect(addr, inference="server")
    agent.act(OBS)
    start.wait()
    n, t_end = 0, time.perf_counter() + secs
    while time.perf_counter() < t_end:
        agent.step(1.0, OBS, False, False)
        agent.act(OBS)
        n += 1
    q.put(n)
    agent.close()


def many_clients(d: ServeProcess, transport: str, clients: int, secs: float) -> dict:
    addr = f"tcp://127.0.0.1:{d.port}" if transport == "tcp" else f"unix://{d.unix_socket}"
    return _throughput(d, [(_worker, (addr, secs))] * clients, secs)


def _vector_worker(addr: str, copies: int, secs: float, q, start) -> None:
    from rlinkd.client_lib.multi import connect_vector
    client = connect_vector(addr, copies, inference="server")
    obs = np.tile(np.asarray(OBS, np.float32), (copies, 1))
    rewards, done = np.ones(copies, np.float32), np.zeros(copies, bool)
    client.act(obs)
    start.wait()
    n, t_end = 0, time.perf_counter() + secs
    while time.perf_counter() < t_end:
        client.step(rewards, obs, done, done)
        client.act(obs)
        n += copies
    q.put(n)
    client.step(rewards, obs, ~done, done)
    client.close()


def vector_clients(d: ServeProcess, transport: str, agents: int, procs: int, secs: float) -> dict:
    """``agents`` agents as ``procs`` processes of ``connect_vector(..., inference="server")``."""
    addr = f"tcp://127.0.0.1:{d.port}" if transport == "tcp" else f"unix://{d.unix_socket}"
    return _throughput(d, [(_vector_worker, (addr, agents // procs, secs))] * procs, secs)


def _throughput(d: ServeProcess, workers: list, secs: float) -> dict:
    """Actions/s of ``workers`` ((target, args) per process, each putting its count on a
    queue after ``start``), with the role's batch sizes and CPU over the same interval."""
    ctx = mp.get_context("fork")
    q, start = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=target, args=(*args, q, start)) for target, args in workers]
    for p in procs:
        p.start()
    time.sleep(3.0)
    before = d.status()["inference"]
    start.set()
    total = sum(q.get(timeout=secs + 120) for _ in procs)
    for p in procs:
        p.join(30)
    time.sleep(1.2)  # one more status report from the role
    after = d.status()["inference"]
    actions = after["actions"] - before.get("actions", 0)
    batches = after["batches"] - before.get("batches", 0)
    return {"actions_per_s": round(total / secs), "mean_batch_size": round(actions / max(batches, 1), 1),
            "inference_cpu_ms_per_1000_actions": round(1e6 * (after["cpu_s"] - before.get("cpu_s", 0))
                                                       / max(actions, 1), 1),
            "batch_sizes": _histogram_delta(before.get("batch_sizes", {}), after["batch_sizes"])}


def _histogram_delta(before: dict, after: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def solve_run(inference: str, transport: str, num_envs: int, seed: int, timeout_s: float) -> dict:
    cmd = [*demo_command(2, transport, seed, timeout_s=timeout_s), "--inference", inference,
           "--num-envs", str(num_envs)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout_s + 120)
    s = demo_summary(proc.stdout)
    return {"seed": seed, "solved": bool(s.get("solved")), "wall_s": round(time.monotonic() - t0, 2),
            "env_steps": s.get("env_steps")}


SOLVE_DEFINITIONS = {"client-side (demo, 2 TCP clients)": ("client", "tcp", 1),
                     "server-side, 2 shm clients": ("server", "shm", 1),
                     "server-side, 2 TCP clients": ("server", "tcp", 1),
                     "server-side, 2 shm vector clients x 4 envs": ("server", "shm", 4),
                     "server-side, 2 TCP vector clients x 4 envs": ("server", "tcp", 4)}


def _row(name: str, p: dict, target: str = "", digits: int = 0) -> str:
    return f"| {name} | {p['p50']:.{digits}f} µs | {p['p99']:.{digits}f} µs | {target} |"


def table_markdown(r: dict) -> str:
    """The write-up's tables from one result."""
    lim, one, many = r["limits_us"], r["one_client_us"], r["many_clients"]
    fwd = lim["forward_batch1"]
    lines = ["| one action, one client | p50 | p99 | target (p50) |", "| --- | --- | --- | --- |",
             _row("rlinkd, shared memory (`unix://`)", one["shm"], "≤ 50 µs"),
             _row("rlinkd, TCP (a serving connection: answered by the inference role)", one["tcp"], "≤ 200 µs"),
             _row("limit: blocking shm round trip (word + eventfd each way)", lim["shm_round_trip"]),
             _row("limit: TCP + orjson round trip (echo)", lim["tcp_orjson_round_trip"]),
             _row("limit: onnxruntime batch-1 forward", fwd["onnxruntime"], digits=1),
             _row("limit: numpy batch-1 forward", fwd["numpy"], digits=1), "",
             f"| {many['clients']} client processes | actions/s | mean batch | inference CPU per 1,000 "
             "actions | target |", "| --- | --- | --- | --- | --- |"]
    for t, target in (("shm", "≥ 100,000"), ("tcp", "≥ 30,000")):
        m = many[t]
        lines.append(f"| {t} | {m['actions_per_s']:,} | {m['mean_batch_size']} | "
                     f"{m['inference_cpu_ms_per_1000_actions']} ms | {target} |")
    lines += ["", f"| {many['clients']} agents in vector clients (processes x copies) | actions/s | "
              "mean batch | inference CPU per 1,000 actions | target |", "| --- | --- | --- | --- | --- |"]
    for name, m in r.get("vector_clients", {}).items():
        target = "≥ 100,000" if name.startswith("shm") else "≥ 30,000"
        lines.append(f"| {name} | {m['actions_per_s']:,} | {m['mean_batch_size']} | "
                     f"{m['inference_cpu_ms_per_1000_actions']} ms | {target} |")
    lines += ["", "| CartPole-v1 to mean return 450 | solved | wall time (median, min – max) |",
              "| --- | --- | --- |"]
    for name, s in r["solve"].items():
        w = s["wall_s"]
        lines.append(f"| {name} | {s['solved']}/{len(s['runs'])} | {w['median']:.1f} s "
                     f"({w['min']:.1f} – {w['max']:.1f}) |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="seeds of the time-to-solve comparison")
    ap.add_argument("--clients", type=int, default=64, help="client processes of the throughput test")
    ap.add_argument("--seconds", type=float, default=8.0, help="length of each throughput test")
    ap.add_argument("--quick", action="store_true", help="fewer iterations, one solve run each")
    ap.add_argument("--out", help="result file (default: bench/results/serving.json)")
    args = ap.parse_args()
    n = 2000 if args.quick else 10000
    result: dict = {"limits_us": {"shm_round_trip": shm_round_trip(n), "tcp_orjson_round_trip": tcp_round_trip(n),
                                  "forward_batch1": forward_costs(n)}}
    with ServeProcess(Path(tempfile.mkdtemp(prefix="rlinkd-bench-serving-")) / "state", NO_TRAINING) as d:
        time.sleep(2.0)
        result["one_client_us"] = {t: one_client_latency(d, t, n) for t in ("shm", "tcp")}
        result["many_clients"] = {t: many_clients(d, t, args.clients, args.seconds) for t in ("shm", "tcp")}
        result["many_clients"]["clients"] = args.clients
        result["vector_clients"] = {f"{t} {procs}x{args.clients // procs}": vector_clients(
            d, t, args.clients, procs, args.seconds) for t in ("shm", "tcp") for procs in (1, 4)}
    runs: dict[str, list] = {name: [] for name in SOLVE_DEFINITIONS}
    for seed in range(1 if args.quick else args.runs):
        for name, (inference, transport, num_envs) in SOLVE_DEFINITIONS.items():
            runs[name].append(solve_run(inference, transport, num_envs, seed, 300.0 if args.quick else 600.0))
            print(name, runs[name][-1], flush=True)
    result["solve"] = {name: {"runs": r, "wall_s": median_range([x["wall_s"] for x in r if x["solved"]] or [0]),
                              "solved": sum(x["solved"] for x in r)} for name, r in runs.items()}
    path = write_result("serving", result, args.out)
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    print(table_markdown(result))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
