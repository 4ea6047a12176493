"""Each native part of the inference role on against off, everything else the same.

    python -m bench.scenarios.native_ab [--runs 5] [--clients 32] [--seconds 6] [--parts scan,step]
                                        [--client c|python] [--quick] [--out FILE]

For each part of ``inference.native_parts`` (scan.c, step.c, direct.c, net.c) two arms: the
part on and the part off, every other setting the same (for ``net`` both arms leave ``step``
out, since step.c runs net.c's program). ``--runs`` runs of each arm, interleaved (on, off,
on, off, ...), each on a fresh daemon that does not train (the serving benchmark's settings),
measure what that part should move:

- ``shm`` / ``tcp``: actions/s of ``--clients`` single-agent client processes at once over
  shared-memory lanes / TCP (direct connections), C clients (client_lib/c/examples/cartpole.c)
  or Python ones (``--client python``), and the inference role's CPU per 1,000 actions over
  the same interval (status ``inference.cpu_s`` / ``actions``);
- ``p50 shm`` / ``p50 tcp``: one Python client's p50 ``step`` + ``act`` round trip.

Per measurement and arm the median and the spread (min – max); the gain is the on arm's
median against the off arm's (positive: the part helps; for latency and CPU, less is
better). A measurement counts for its part when the gain exceeds the spread, that is when
the two arms' ranges do not overlap: every run with the part beats every run without it
("gain"; every run without it beats every run with it: "loss"; else "noise"). With 5
interleaved runs an arm, a separation that complete happens by chance with probability
2/252 < 1 % (the exact two-sided Mann-Whitney test, U = 0). A part **earns its place** when
some measurement gains and none loses. Each run also records the parts the role reports
serving (status ``inference.native_parts``), so an arm whose part did not serve (e.g.
``auto`` timed numpy faster than the native interpreter) shows. ``--judge FILE`` judges the
runs of an earlier result file again without measuring.
Writes bench/results/native_ab.json.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import orjson

from bench.harness.common import fmt_mr, median_range, write_result
from rlinkd.daemon.config import NATIVE_PARTS
from rlinkd.daemon.launch import ServeProcess

MEASURES = {"shm": ("shm", "actions/s", True), "tcp": ("tcp", "actions/s", True),
            "shm cpu": ("shm", "role CPU ms / 1,000 actions", False),
            "tcp cpu": ("tcp", "role CPU ms / 1,000 actions", False),
            "p50 shm": ("p50 shm", "one client's p50 µs", False),
            "p50 tcp": ("p50 tcp", "one client's p50 µs", False)}
"""measurement -> (the load that gives it, unit, higher is better)."""
PARTS = {"scan": ("shm", "shm cpu", "p50 shm"),
         "step": ("shm", "tcp", "shm cpu", "tcp cpu", "p50 shm", "p50 tcp"),
         "direct": ("tcp", "tcp cpu", "p50 tcp"),
         "net": ("shm", "tcp", "shm cpu", "tcp cpu", "p50 shm", "p50 tcp")}
"""part -> the measurements it should move."""


def arms(part: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(parts on, parts off) of a part's A/B: every part with it and without it (``net``:
    both without ``step``, which needs it)."""
    base = [p for p in NATIVE_PARTS if not (part == "net" and p == "step")]
    return tuple(base), tuple(p for p in base if p != part)


def compare(on: list[float], off: list[float], higher_better: bool) -> dict:
    """Medians and ranges of both arms, the on arm's relative gain (positive: better with
    the part), the measurement's spread (the larger relative range of the two arms, for the
    report) and the verdict: "gain" when every on run beats every off run, "loss" when every
    off run beats every on run, else "noise" ("n/a" with one run an arm: no spread)."""
    m_on, m_off = statistics.median(on), statistics.median(off)
    gain = (m_on - m_off) / m_off if higher_better else (m_off - m_on) / m_off
    spread = max((max(v) - min(v)) / statistics.median(v) for v in (on, off))
    better, worse = (on, off) if higher_better else (off, on)  # (larger is better in `better`)
    verdict = ("n/a" if min(len(on), len(off)) < 2 else "gain" if min(better) > max(worse)
               else "loss" if max(better) < min(worse) else "noise")
    return {"on": median_range(on, 1), "off": median_range(off, 1), "gain": round(gain, 4),
            "spread": round(spread, 4), "verdict": verdict}


def part_verdict(comparisons: dict[str, dict]) -> bool | None:
    """A part earns its place: some measurement gains beyond its spread, none loses beyond it
    (None: too few runs to say)."""
    verdicts = [c["verdict"] for c in comparisons.values()]
    if "n/a" in verdicts:
        return None
    return "gain" in verdicts and "loss" not in verdicts


# ---------------------------------------------------------------- one arm, one run
def load(d: ServeProcess, kind: str, transport: str, clients: int, seconds: float, binary: Path | None) -> dict:
    """``clients`` processes over ``transport``: actions/s and the role's CPU per 1,000 actions."""
    if kind == "c":
        from bench.scenarios.c_client import many_c_once
        address = f"shm://{d.unix_socket}" if transport == "shm" else f"tcp://127.0.0.1:{d.port}"
        assert binary is not None
        got = many_c_once(d, binary, address, clients, seconds, evaluate=False)
    else:
        from bench.scenarios.serving import many_clients
        got = many_clients(d, transport, clients, seconds)
    return {transport: got["actions_per_s"], f"{transport} cpu": got["inference_cpu_ms_per_1000_actions"]}


def one_arm(parts: tuple[str, ...], wanted: tuple[str, ...], args, binary: Path | None) -> dict:
    """One daemon with ``inference.native_parts = parts``: the ``wanted`` measurements, and
    the parts the role reported serving."""
    from bench.scenarios.serving import NO_TRAINING, one_client_latency
    state = Path(tempfile.mkdtemp(prefix="rlinkd-native-ab-"))
    got: dict = {}
    try:
        with ServeProcess(state / "state", [*NO_TRAINING, "--set", f"inference.native_parts=[{_toml(parts)}]"]) as d:
            time.sleep(1.0)
            for transport in ("shm", "tcp"):
                if transport in wanted or f"{transport} cpu" in wanted:
                    got |= load(d, args.client, transport, args.clients, args.seconds, binary)
                if f"p50 {transport}" in wanted:
                    got[f"p50 {transport}"] = one_client_latency(d, transport, args.latency_n)["p50"]
            got["serving"] = d.status()["inference"].get("native_parts", [])
    finally:
        shutil.rmtree(state, ignore_errors=True)
    return got


def _toml(parts: tuple[str, ...]) -> str:
    return ",".join(f'"{p}"' for p in parts)


def ab(part: str, args, binary: Path | None) -> dict:
    """``args.runs`` runs of each arm, interleaved; the comparison of every measurement."""
    wanted, (on_parts, off_parts) = PARTS[part], arms(part)
    runs: dict[str, list[dict]] = {"on": [], "off": []}
    for i in range(args.runs):
        for arm, parts in (("on", on_parts), ("off", off_parts)):
            runs[arm].append(one_arm(parts, wanted, args, binary))
            print(part, arm, i, runs[arm][-1], flush=True)
    comparisons = {m: compare([r[m] for r in runs["on"]], [r[m] for r in runs["off"]], MEASURES[m][2])
                   for m in wanted}
    served = all(part in r["serving"] for r in runs["on"]) and not any(part in r["serving"] for r in runs["off"])
    verdict = part_verdict(comparisons)
    return {"on_parts": list(on_parts), "off_parts": list(off_parts), "runs": runs,
            "measures": comparisons, "arms_served_as_asked": served,
            "earns_its_place": None if verdict is None else verdict and served}


def judge(result: dict) -> dict:
    """``result`` with every part's comparisons and verdict computed again from its runs."""
    for part, r in result["parts"].items():
        runs = r["runs"]
        r["measures"] = {m: compare([x[m] for x in runs["on"]], [x[m] for x in runs["off"]], MEASURES[m][2])
                         for m in PARTS[part]}
        verdict = part_verdict(r["measures"])
        r["earns_its_place"] = None if verdict is None else verdict and r["arms_served_as_asked"]
    result["table_markdown"] = table_markdown(result)
    return result


# ---------------------------------------------------------------- report
def table_markdown(result: dict) -> str:
    """One row per part and measurement: both arms (median, min – max), gain, spread, verdict."""
    lines = [f"| part | measurement ({result['clients']} {result['client']} clients) | on | off | gain | "
             "spread | counts | part earns its place |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for part, r in result["parts"].items():
        verdict = {True: "**yes**", False: "no", None: "n/a (one run an arm)"}[r["earns_its_place"]]
        if not r["arms_served_as_asked"]:
            verdict += " (an arm did not serve as asked)"
        for i, (m, c) in enumerate(r["measures"].items()):
            unit = MEASURES[m][1]
            lines.append(f"| {part if i == 0 else ''} | {m}: {unit} | {fmt_mr(c['on'], 1)} | {fmt_mr(c['off'], 1)} | "
                         f"{100 * c['gain']:+.1f} % | {100 * c['spread']:.1f} % | {c['verdict']} | "
                         f"{verdict if i == 0 else ''} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="runs of each arm, interleaved (on, off, on, ...)")
    ap.add_argument("--clients", type=int, default=32, help="client processes of the throughput loads")
    ap.add_argument("--seconds", type=float, default=6.0, help="length of each throughput load")
    ap.add_argument("--latency-n", type=int, default=5000, help="round trips of the one-client p50")
    ap.add_argument("--parts", default=",".join(NATIVE_PARTS), help="parts to compare (comma-separated)")
    ap.add_argument("--client", choices=("c", "python"), default="c", help="the throughput loads' clients")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1 run per arm, 8 clients, 2 s each")
    ap.add_argument("--out", help="result file (default: bench/results/native_ab.json)")
    ap.add_argument("--judge", help="judge the runs of this result file again (no measuring); writes --out or it")
    args = ap.parse_args()
    if args.judge:
        result = judge(orjson.loads(Path(args.judge).read_bytes()))  # (its command and date kept)
        Path(args.out or args.judge).write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
        print(result["table_markdown"])
        return 0
    if args.quick:
        args.runs, args.clients, args.seconds, args.latency_n = 1, 8, 2.0, 500
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        ap.error(f"unknown part {unknown[0]} (known: {', '.join(PARTS)})")
    binary = None
    if args.client == "c":
        from bench.scenarios.c_client import build
        binary = build(Path(tempfile.mkdtemp(prefix="rlinkd-cbuild-")))
    result = {"quick": args.quick, "runs_per_arm": args.runs, "clients": args.clients, "client": args.client,
              "seconds": args.seconds, "parts": {part: ab(part, args, binary) for part in parts}}
    result["table_markdown"] = table_markdown(result)
    write_result("native_ab", result, args.out)
    print(orjson.dumps({p: {m: c["verdict"] for m, c in r["measures"].items()}
                        for p, r in result["parts"].items()}).decode())
    print(result["table_markdown"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
