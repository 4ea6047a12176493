"""Profile one ``rlinkd demo`` run with py-spy, summarised per process.

    .venv/bin/python -m bench.scenarios.profile_demo [--clients 2] [--transport tcp] [--rate 100] [--quick]

``py-spy record --subprocesses --format raw --nonblocking`` launches the demo and samples
it and every descendant (supervisor, collector, connector, learner, checkpointer, the
clients) at ``--rate`` Hz until the demo exits; idle threads (blocked in poll/select/sleep)
are not sampled, so a process's sample count is roughly its busy time × rate. While it
runs, the daemon's status gives which pid plays which role.

Per process: ``busy_share`` = samples / (rate × wall), ``top_self`` = functions where the
samples were taken (leaf frames), ``top_inclusive`` = functions on the stack (entry frames
present in >= 90 % of the process's samples are left out), each as a share of that
process's samples. Writes ``bench/results/profile.json`` and prints a markdown summary.
``--quick`` stops the demo after 20 s whether solved or not.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

from rlinkd.client_lib.transport import RLlinkError
from rlinkd.daemon.runfiles import query_status, read_daemon_file

from bench.harness.common import REPO, print_table, write_result
from bench.harness.demo import demo_command

PYSPY = Path(sys.executable).parent / "py-spy"
PROCESS_FRAME = re.compile(r'process (\d+):"([^"]*)";?')
"""py-spy's process frames; a spawned child's command line itself contains ';'."""
TOP_N = 10


def watch_roles(state_dir: Path, roles: dict, stop: threading.Event) -> None:
    """Thread: record {pid: role} from the daemon's status while the demo runs."""
    while not stop.is_set():
        info = read_daemon_file(state_dir)
        try:
            status = query_status(info, timeout_s=5.0) if info else {}
        except (OSError, RLlinkError, ValueError):  # not answering yet, or stopping
            status = {}
        if status:
            roles[int(info["pid"])] = "supervisor"
        for role, child in (status.get("children") or {}).items():
            if child.get("pid"):
                roles[int(child["pid"])] = role
        stop.wait(0.5)


def role_of(pid: int, cmdline: str, roles: dict) -> str:
    """Role name from the status map, else from the command line."""
    if pid in roles:
        return roles[pid]
    for needle, name in (("daemon.cli client", "client"), ("daemon.cli demo", "demo"),
                         ("daemon.cli serve", "supervisor"), ("resource_tracker", "resource_tracker")):
        if needle in cmdline:
            return name
    return "other"


def parse_raw(path: Path) -> dict[int, dict]:
    """{pid: {"cmdline", "samples", "stacks": Counter(tuple(frames) -> n)}} from py-spy raw."""
    procs: dict[int, dict] = defaultdict(lambda: {"cmdline": "", "samples": 0, "stacks": Counter()})
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        pos, last = 0, None
        while (m := PROCESS_FRAME.match(stack, pos)) is not None:
            pos, last = m.end(), m
        if last is None:
            continue
        pid_s, cmdline = last.groups()
        proc = procs[int(pid_s)]
        proc["cmdline"], proc["samples"] = cmdline, proc["samples"] + int(count)
        proc["stacks"][tuple(stack[pos:].split(";")) if stack[pos:] else ()] += int(count)
    return dict(procs)


def top_functions(stacks: Counter, total: int) -> tuple[list, list]:
    """(top self, top inclusive) as [(function, share %)]."""
    self_c, incl = Counter(), Counter()
    for frames, n in stacks.items():
        if frames:
            self_c[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    entry = {f for f, n in incl.items() if n >= 0.9 * total}
    share = lambda n: round(100.0 * n / total, 1)  # noqa: E731
    return ([(f, share(n)) for f, n in self_c.most_common(TOP_N)],
            [(f, share(n)) for f, n in incl.most_common() if f not in entry][:TOP_N])


def summarize(procs: dict[int, dict], roles: dict, rate: float, wall_s: float) -> list[dict]:
    out = []
    for pid, p in sorted(procs.items(), key=lambda kv: -kv[1]["samples"]):
        if not p["samples"]:
            continue
        top_self, top_incl = top_functions(p["stacks"], p["samples"])
        out.append({"pid": pid, "role": role_of(pid, p["cmdline"], roles), "samples": p["samples"],
                    "busy_share": round(p["samples"] / (rate * wall_s), 3), "cmdline": p["cmdline"][:160],
                    "top_self": top_self, "top_inclusive": top_incl})
    return out


def run_profiled(clients: int, transport: str, rate: float, timeout_s: float, state_dir: Path) -> dict:
    raw = state_dir / "pyspy.raw.txt"
    demo = demo_command(clients, transport, timeout_s=timeout_s, state_dir=str(state_dir / "demo"))
    cmd = [str(PYSPY), "record", "--subprocesses", "--nonblocking", "--function", "--format", "raw",
           "--rate", str(int(rate)), "--output", str(raw), "--", *demo]
    roles: dict = {}
    stop = threading.Event()
    watcher = threading.Thread(target=watch_roles, args=(state_dir / "demo", roles, stop), daemon=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    watcher.start()
    out, _ = proc.communicate(timeout=timeout_s + 180)
    wall = time.monotonic() - t0
    stop.set()
    solved_line = next((line for line in out.splitlines() if line.startswith(("SOLVED", "NOT SOLVED"))), "")
    if not raw.exists():
        raise RuntimeError(f"py-spy wrote no profile (exit {proc.returncode}):\n{out[-2000:]}")
    return {"wall_s": round(wall, 1), "demo_result": solved_line, "pyspy_exit": proc.returncode,
            "processes": summarize(parse_raw(raw), roles, rate, wall), "raw_profile": str(raw)}


def markdown(res: dict) -> str:
    parts = [f"Profile of `rlinkd demo --clients {res['clients']} --transport {res['transport']}` "
             f"({res['wall_s']} s, py-spy {res['rate']} Hz, busy samples only): {res['demo_result']}"]
    rows = [(p["role"], p["pid"], p["samples"], f"{100 * p['busy_share']:.0f} %",
             "<br>".join(f"{f} {s} %" for f, s in p["top_self"][:5]))
            for p in res["processes"] if p["role"] not in ("resource_tracker", "other")]
    parts.append(print_table("Busy share and top functions (self) per process",
                             ("process", "pid", "samples", "busy", "top self (share of the process's samples)"),
                             rows))
    return "\n\n".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--transport", default="tcp", choices=("tcp", "shm", "mixed"))
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--timeout-s", type=float, default=600.0)
    ap.add_argument("--quick", action="store_true", help="stop the demo after 20 s")
    args = ap.parse_args()
    state_dir = Path(tempfile.mkdtemp(prefix="rlinkd-bench-prof-"))
    res = {"quick": args.quick, "clients": args.clients, "transport": args.transport, "rate": args.rate,
           **run_profiled(args.clients, args.transport, args.rate, 20.0 if args.quick else args.timeout_s,
                          state_dir)}
    res["summary_markdown"] = markdown(res)
    write_result("profile", res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
