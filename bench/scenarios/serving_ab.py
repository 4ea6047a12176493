"""Server-side actions of this checkout's daemon against another checkout's, interleaved.

    python -m bench.scenarios.serving_ab --before DIR [--runs 5] [--clients 64] [--seconds 6]
                                         [--latency-n 5000] [--quick] [--out FILE]

``DIR`` is another checkout of rlinkd with its own ``.venv`` (``make install`` there): its
daemon runs as ``DIR/.venv/bin/python -m rlinkd.daemon.cli serve``. Both arms take the same
settings (the serving benchmark's: a daemon that does not train), the same clients (this
checkout's C client, client_lib/c/examples/cartpole.c, and this checkout's client_lib for the
one-client latency) and run alternately (after, before, after, ...), ``--runs`` times each:

- ``tcp`` / ``shm``: actions/s of ``--clients`` single-agent C clients at once, over TCP (direct
  connections) and over shared-memory lanes, and the inference role's CPU per 1,000 actions;
- ``p50 tcp`` / ``p50 shm``: one Python client's p50 ``step`` + ``act`` round trip.

Per measurement the medians and spreads of both arms, the change (positive: this checkout is
better) and whether it exceeds the spread (``bench.scenarios.native_ab.compare``). This is
how a restructuring of the serving path shows that its figures stayed within their noise.
Writes bench/results/serving_ab.json.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.harness.common import fmt_mr, write_result
from bench.scenarios.native_ab import MEASURES, compare
from rlinkd.daemon.launch import ServeProcess, serve_command

WANTED = ("tcp", "shm", "tcp cpu", "shm cpu", "p50 tcp", "p50 shm")


@dataclass
class CheckoutServe(ServeProcess):
    """``rlinkd serve`` run by another interpreter (another checkout's venv), in this
    process's environment (``env`` is not used)."""

    python: str = sys.executable

    def launch(self) -> CheckoutServe:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        command = [self.python, *serve_command(self.state_dir, self.args)[1:]]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        return self


def checkout_python(directory: Path) -> str:
    """DIR/.venv/bin/python, which must import rlinkd from DIR (SystemExit otherwise)."""
    python = directory / ".venv" / "bin" / "python"
    found = subprocess.run([str(python), "-c", "import rlinkd.daemon.cli as c; print(c.__file__)"],
                           capture_output=True, text=True, check=False)
    if found.returncode != 0 or not Path(found.stdout.strip()).resolve().is_relative_to(directory.resolve()):
        raise SystemExit(f"{python} does not import rlinkd from {directory}: {found.stdout}{found.stderr}")
    return str(python)


def one_run(python: str, args, binary: Path) -> dict:
    """One daemon run by ``python``: every measurement of WANTED."""
    from bench.scenarios.native_ab import load
    from bench.scenarios.serving import NO_TRAINING, one_client_latency
    state = Path(tempfile.mkdtemp(prefix="rlinkd-serving-ab-"))
    got: dict = {}
    try:
        with CheckoutServe(state / "state", list(NO_TRAINING), python=python) as d:
            time.sleep(1.0)
            for transport in ("tcp", "shm"):
                got |= load(d, "c", transport, args.clients, args.seconds, binary)
                got[f"p50 {transport}"] = one_client_latency(d, transport, args.latency_n)["p50"]
    finally:
        shutil.rmtree(state, ignore_errors=True)
    return got


def table_markdown(result: dict) -> str:
    """One row per measurement: both arms (median, min – max), change, spread, verdict."""
    lines = [f"| measurement ({result['clients']} C clients) | this checkout | before | change | spread | "
             "beyond the spread |", "| --- | --- | --- | --- | --- | --- |"]
    for m, c in result["measures"].items():
        lines.append(f"| {m}: {MEASURES[m][1]} | {fmt_mr(c['on'], 1)} | {fmt_mr(c['off'], 1)} | "
                         f"{100 * c['gain']:+.1f} % | "
                     f"{100 * c['spread']:.1f} % | {c['verdict']} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, type=Path,
                    help="the other checkout (with its own .venv) whose daemon is the 'before' arm")
    ap.add_argument("--label", default="", help="what the other checkout is (e.g. its commit), for the report")
    ap.add_argument("--runs", type=int, default=5, help="runs of each arm, interleaved (after, before, ...)")
    ap.add_argument("--clients", type=int, default=64, help="C client processes of the throughput loads")
    ap.add_argument("--seconds", type=float, default=6.0, help="length of each throughput load")
    ap.add_argument("--latency-n", type=int, default=5000, help="round trips of the one-client p50")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1 run per arm, 8 clients, 2 s each")
    ap.add_argument("--out", help="result file (default: bench/results/serving_ab.json)")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.clients, args.seconds, args.latency_n = 1, 8, 2.0, 500
    before = checkout_python(args.before)
    from bench.scenarios.c_client import build
    binary = build(Path(tempfile.mkdtemp(prefix="rlinkd-cbuild-")))
    runs: dict[str, list[dict]] = {"after": [], "before": []}
    for i in range(args.runs):
        for arm, python in (("after", sys.executable), ("before", before)):
            runs[arm].append(one_run(python, args, binary))
            print(arm, i, runs[arm][-1], flush=True)
    result = {"quick": args.quick, "before": args.label or str(args.before.name), "runs_per_arm": args.runs,
              "clients": args.clients, "seconds": args.seconds, "runs": runs,
              "measures": {m: compare([r[m] for r in runs["after"]], [r[m] for r in runs["before"]],
                                      MEASURES[m][2]) for m in WANTED}}
    result["table_markdown"] = table_markdown(result)
    write_result("serving_ab", result, args.out)
    print(orjson.dumps({m: c["verdict"] for m, c in result["measures"].items()}).decode())
    print(result["table_markdown"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
