"""Run the whole benchmark suite and regenerate the marked section of BENCHMARKS.md.

    .venv/bin/python -m bench.run_all [--quick] [--runs 3] [--skip NAME ...] [--only NAME ...]
                                      [--report-only]

(``make bench`` runs it without flags.) Scripts, in order, each as its own process (one
failing does not stop the others; the exit code says whether all succeeded):

    demo           bench.solve --runs 5  -> bench/results/solve.json   (default config, seeds 0-4)
    transport      bench.transport       -> bench/results/transport.json
    latency        bench.latency         -> bench/results/latency.json
    rlinkd_solve   bench.rlinkd_solve    -> bench/results/solve_compare.json
    rllib          bench.rllib_baseline  -> bench/results/rllib.json   (~30+ min, saturates the machine)
    profile        bench.profile_demo    -> bench/results/profile.json
    soak           bench.soak            -> bench/results/soak.json    (10 min, 64 TCP + 8 shm clients)
    chaos          bench.chaos           -> bench/results/chaos.json   (20 kills)
    fuzz           pytest tests/test_fuzz_live.py -> bench/results/fuzz.json

``--quick`` is a smoke test: ``--quick`` to the benchmark scripts (small sizes, one run, the
RLlib baseline reduced to one 90-s external-mode run of ray 2.48), one demo run, a 60-s soak
and a 4-kill chaos run (those three write ``*-quick.json`` files the report ignores). Then the text between
``<!-- bench:start -->`` and ``<!-- bench:end -->`` in BENCHMARKS.md (markers appended at
the end when absent; the rest of the file is kept) is replaced with: the exact commands, the
machine's CPU count, every table (medians with min–max), the rlinkd/RLlib ratios (wall time,
env steps, steps/s, RSS) computed from the results of this invocation, and one line per
target saying met or missed. ``--report-only`` only regenerates that section from the JSON
files already in bench/results.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.common import REPO, RESULTS, fmt_num

BENCHMARKS_MD = REPO / "BENCHMARKS.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"
SCRIPTS = {  # name: (module, result file, extra args for a full run, for a --quick run)
    "demo": ("bench.solve", "solve.json", ["--runs", "5"], ["--runs", "1", "--out", "{results}/solve-quick.json"]),
    "transport": ("bench.transport", "transport.json", [], ["--quick"]),
    "latency": ("bench.latency", "latency.json", [], ["--quick"]),
    "rlinkd_solve": ("bench.rlinkd_solve", "solve_compare.json", ["--runs", "{runs}"], ["--quick"]),
    "rllib": ("bench.rllib_baseline", "rllib.json", ["--runs", "{runs}"], ["--quick"]),
    "profile": ("bench.profile_demo", "profile.json", [], ["--quick"]),
    "soak": ("bench.soak", "soak.json", [], ["--duration-s", "60", "--out", "{results}/soak-quick.json"]),
    "chaos": ("bench.chaos", "chaos.json", [], ["--kills", "4", "--out", "{results}/chaos-quick.json"]),
    "fuzz": ("pytest", "fuzz.json", ["-q", "-p", "no:cacheprovider", "tests/test_fuzz_live.py"],
             ["-q", "-p", "no:cacheprovider", "tests/test_fuzz_live.py"]),
}
TRANSPORT_TARGETS = [
    ("shm single steps ≥ 1,000,000 steps/s", lambda t: t["shm_single"]["steps_per_s"]["median"], 1_000_000, True,
     lambda v: f"{fmt_num(v)} steps/s"),
    ("shm batches of 1,024 ≥ 20,000,000 steps/s", lambda t: t["shm_batch"]["steps_per_s"]["median"], 20_000_000,
     True, lambda v: f"{fmt_num(v)} steps/s"),
    ("wake-up latency p50 ≤ 30 µs (doorbell FIFO)", lambda t: t["wakeup_fifo_us"]["p50"], 30.0, False,
     lambda v: f"{v} µs"),
    ("idle daemon CPU ≤ 2 % of a core (8 silent shm clients)",
     lambda t: t["idle_cpu"]["cpu_percent_of_one_core"], 2.0, False, lambda v: f"{v:.2f} %"),
]


# ---------------------------------------------------------------- running
def script_command(name: str, quick: bool, runs: int) -> list[str]:
    module, _, full, smoke = SCRIPTS[name]
    args = [a.format(runs=runs, results=RESULTS) for a in (smoke if quick else full)]
    return [sys.executable, "-m", module, *args]


def run_script(name: str, quick: bool, runs: int) -> dict:
    """Run one script (output streamed through); returns its exit code and duration."""
    cmd = script_command(name, quick, runs)
    print(f"\n===== {name}: {' '.join(cmd[1:])}", flush=True)
    t0 = time.monotonic()
    # the fuzz module writes its figures only when asked to (a plain test run writes nothing)
    env = dict(os.environ, RLINKD_FUZZ_REPORT=str(RESULTS / SCRIPTS["fuzz"][1])) if name == "fuzz" and not quick \
        else None
    code = subprocess.call(cmd, cwd=REPO, env=env)
    took = round(time.monotonic() - t0, 1)
    print(f"===== {name}: exit {code} after {took} s", flush=True)
    return {"exit": code, "seconds": took}


# ---------------------------------------------------------------- report
def load(name: str) -> dict | None:
    path = RESULTS / SCRIPTS[name][1]
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def provenance(results: dict, ran: dict) -> list[str]:
    """One line per result file: command, when, whether this invocation produced it."""
    lines = []
    for name, doc in results.items():
        if doc is None:
            lines.append(f"- {name}: no results ({SCRIPTS[name][1]} missing)")
            continue
        fresh = "this invocation" if name in ran and ran[name]["exit"] == 0 else "an earlier invocation"
        quick = " — **quick smoke run, not for publication**" if doc.get("quick") else ""
        lines.append(f"- `{doc.get('command', name)}` — {doc.get('measured_at', '?')}, from {fresh}, load average "
                     f"{doc.get('load_avg_1m_at_end')} at the end{quick}")
    return lines


def ratio(a, b) -> str:
    if a is None or b is None or not b:
        return "–"
    return f"{a / b:.2f}"


def ratio_rows(solve: dict, rllib: dict) -> list[tuple]:
    """rlinkd/RLlib medians per definition (own ↔ example, client-side ↔ external)."""
    rows = []
    pairs = (("own", "example", "own criterion ↔ RLlib example"),
             ("client", "external", "client-side last-100 ↔ RLlib external"))
    for crit, mode, label in pairs:
        for version, v in (rllib.get("versions") or {}).items():
            r = ((v.get("modes") or {}).get(mode) or {}).get("summary")
            if not r or not r.get("solved_runs"):
                continue
            for key in ("tcpx1", "shmx1", "tcpx2", "shmx2"):
                s = ((solve.get(crit) or {}).get(key) or {}).get("summary")
                if not s or not s.get("solved_runs"):
                    continue
                med = lambda d, k: (d.get(k) or {}).get("median")  # noqa: E731
                rows.append((label, f"ray {version}", key.replace("x", " × "),
                             ratio(med(s, "wall_s"), med(r, "wall_s")),
                             ratio(med(s, "env_steps"), med(r, "env_steps")),
                             ratio(med(s, "steps_per_s"), med(r, "steps_per_s")),
                             ratio(med(s, "peak_rss_mb"), med(r, "peak_rss_mb"))))
    return rows


def md_table(header: tuple, rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def target_lines(transport: dict | None) -> list[str]:
    out = []
    for label, get, target, higher, fmt in TRANSPORT_TARGETS:
        try:
            value = get(transport) if transport else None
        except (KeyError, TypeError):
            value = None
        if value is None:
            out.append(f"- {label}: **not measured**")
            continue
        met = value >= target if higher else value <= target
        out.append(f"- {label}: {fmt(value)} — **{'met' if met else 'MISSED'}**")
    return out


SOLVE_TARGETS = [  # (label, measure, best RLlib = min or max, rlinkd must be <= or >= factor × best)
    ("wall time ≤ 1/5 of the faster RLlib's", "wall_s", min, 0.2, False),
    ("env steps ≤ the more sample-efficient RLlib's", "env_steps", min, 1.0, False),
    ("env steps/s ≥ 5 × RLlib's", "steps_per_s", max, 5.0, True),
    ("summed peak RSS ≤ 1/3 of RLlib's", "peak_rss_mb", min, 1 / 3, False),
]
DEFINITIONS = (("own", "example", "own stop criterion"), ("client", "external", "client-side last-100"))


def _median(summary: dict | None, key: str):
    return ((summary or {}).get(key) or {}).get("median")


def solve_target_lines(solve: dict | None, rllib: dict | None) -> list[str]:
    """Issue 5's targets, per definition of solved: rlinkd's configurations against the best RLlib."""
    if not solve or not rllib:
        return ["- time-to-solve targets: **not measured** (rlinkd_solve or rllib results missing)"]
    out = []
    for crit, mode, label in DEFINITIONS:
        theirs = [((v.get("modes") or {}).get(mode) or {}).get("summary") for v in rllib["versions"].values()]
        theirs = [t for t in theirs if t and t.get("solved_runs")]
        ours = {k.replace("x", " × "): (v or {}).get("summary") for k, v in (solve.get(crit) or {}).items()}
        for text, key, best_of, factor, higher in SOLVE_TARGETS:
            values = [_median(t, key) for t in theirs if _median(t, key)]
            if not values:
                continue
            bound = best_of(values) * factor
            met = [c for c, o in ours.items() if _median(o, key) is not None
                   and (_median(o, key) >= bound if higher else _median(o, key) <= bound)]
            verdict = ("met" if len(met) == len(ours) else "MISSED" if not met else
                       f"met by {', '.join(met)} only")
            show = (lambda v: f"{v:.1f} s") if key == "wall_s" else fmt_num  # noqa: E731
            got = ", ".join(f"{c} {show(_median(o, key))}" for c, o in ours.items())
            out.append(f"- {label}: {text} (bound {show(bound)}): rlinkd {got} — **{verdict}**")
    return out


def latency_target_lines(latency: dict | None, solve: dict | None) -> list[str]:
    """SET_STATE p50, 64-client p99 (saturated and paced), RLlib 2.48's dummy client solving."""
    out = []
    if latency:
        p50 = latency["set_state_reply"]["on_policy"]["excluding_training_ms"]["p50"]
        out.append(f"- SET_STATE reply (on-policy, 500-step batch, excluding training) p50 ≤ 5 ms: {p50} ms — "
                   f"**{'met' if p50 <= 5 else 'MISSED'}**")
        sat = [p for p in latency["scaling"]["collector"] if p["clients"] == 64]
        for p in sat:
            out.append(f"- 64 concurrent TCP clients, p99 ≤ 50 ms, closed loop at saturation: "
                       f"{p['reply_ms']['p99']} ms — **{'met' if p['reply_ms']['p99'] <= 50 else 'MISSED'}**")
        for p in latency["scaling"].get("paced") or []:
            out.append(f"- 64 concurrent TCP clients, p99 ≤ 50 ms, paced at {p['offered_load']:.0%} of capacity: "
                       f"{p['reply_ms']['p99']} ms — **{'met' if p['reply_ms']['p99'] <= 50 else 'MISSED'}**")
    rc = ((solve or {}).get("rllib_client") or {}).get("summary")
    if rc:
        out.append(f"- RLlib 2.48's dummy client trains against rlinkd to client-side mean ≥ 450: "
                   f"{rc['solved_runs']}/{rc['runs']} runs, {fmt_num(_median(rc, 'wall_s'))} s — "
                   f"**{'met' if rc['solved_runs'] == rc['runs'] else 'MISSED'}**")
    return out


def reliability_rows(fuzz: dict | None, soak: dict | None, chaos: dict | None) -> list[tuple]:
    """Issue 6's table: fuzzing, soak, chaos, one row per figure."""
    rows = []
    if fuzz:
        rows += [("fuzz", "cases tried (TCP + Unix socket, 8 families)", fmt_num(fuzz["cases"])),
                 ("fuzz", "daemon deaths / child restarts", f"{fuzz['daemon_deaths']} / {fuzz['child_restarts']}"),
                 ("fuzz", "RSS growth over the run", f"{fuzz['rss_growth_mb']} MiB")]
    if soak:
        ok = "equal" if not soak["mismatched_clients"] else f"{len(soak['mismatched_clients'])} clients differ"
        rows += [("soak", "duration, clients", f"{soak['duration_s']:.0f} s, {soak['tcp_clients']} TCP + "
                                              f"{soak['shm_clients']} shm"),
                 ("soak", "steps sent / ingested", f"{fmt_num(soak['steps_sent'])} / "
                                                   f"{fmt_num(soak['steps_ingested'])} ({ok})"),
                 ("soak", "episodes dropped for policy lag", str(soak["dropped_episodes"])),
                 ("soak", "summed RSS growth after warm-up (limit 10 %)",
                  f"{soak['rss_growth'] * 100:.1f} % ({soak['rss_mb_start_end'][0]} → "
                  f"{soak['rss_mb_start_end'][1]} MB)"),
                 ("soak", "client errors / error lines in the log",
                  f"{len(soak['client_errors'])} / {len(soak['error_log_lines'])}")]
    if chaos:
        c = chaos["summary"]
        rows += [("chaos", "kills survived", f"{c['survived']} / {c['kills']} (" + ", ".join(
                    f"{target} {n}" for target, n in sorted(c["by_target"].items())) + ")"),
                 ("chaos", "recovery time p50 / max", f"{c['recovery_p50_s']} s / {c['recovery_max_s']} s"),
                 ("chaos", "shm segments leaked; checkpoints corrupt",
                  f"{len(c['shm_leaks'])}; {len(c['corrupt_checkpoints'])} of {c['checkpoints']}"
                  f" (newest loads: {c['newest_loads']})")]
    return rows


def section(results: dict, ran: dict, quick: bool) -> str:
    """The generated markdown between the markers."""
    solve, rllib, transport = results["rlinkd_solve"], results["rllib"], results["transport"]
    latency, profile = results["latency"], results["profile"]
    parts = [f"## Benchmark suite (generated by `make bench`, {time.strftime('%Y-%m-%d %H:%M')})",
             f"Machine: {os.cpu_count()} CPUs ({cpu_model()}), load average at report time "
             f"{os.getloadavg()[0]:.2f}. Medians with (min – max); wall times include start-up. "
             "Regenerate with `.venv/bin/python -m bench.run_all` (this section only, from the JSON files: "
             "`--report-only`)." + (" **Quick smoke run: figures are not for publication.**" if quick else ""),
             "### Commands and provenance", "\n".join(provenance(results, ran)),
             "### Targets",
             "\n".join(target_lines(transport) + solve_target_lines(solve, rllib)
                       + latency_target_lines(latency, solve))]
    if solve and rllib:
        rows = ratio_rows(solve, rllib)
        parts += ["### rlinkd / RLlib ratios (< 1: rlinkd needs less; steps/s > 1: rlinkd is faster)",
                  md_table(("definition", "RLlib", "rlinkd clients", "wall time", "env steps", "steps/s",
                            "peak RSS"), rows) if rows else "(no configuration solved on both sides)"]
    reliability = reliability_rows(results["fuzz"], results["soak"], results["chaos"])
    if reliability:
        parts += ["### Reliability (fuzzing, soak, chaos)", md_table(("run", "figure", "value"), reliability)]
    for title, doc, key in (("`make demo` with the default config, one run per seed", results["demo"],
                             "table_markdown"),
                            ("Time to solve: rlinkd", solve, "table_markdown"),
                            ("Time to solve: RLlib", rllib, "table_markdown"),
                            ("Transport", transport, "table_markdown"),
                            ("Latency and scaling", latency, "tables_markdown"),
                            ("Where the time goes (py-spy)", profile, "summary_markdown")):
        if doc and doc.get(key):
            parts += [f"### {title}", doc[key]]
    return "\n\n".join(parts)


def write_section(text: str, path: Path = BENCHMARKS_MD) -> None:
    """Replace the text between the markers (append the markers when absent)."""
    doc = path.read_text() if path.exists() else "# rlinkd benchmarks\n"
    block = f"{START}\n{text}\n{END}"
    if START in doc and END in doc and doc.index(START) < doc.index(END):
        head, rest = doc.split(START, 1)
        tail = rest.split(END, 1)[1]
        doc = head + block + tail
    else:
        doc = doc.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(doc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="pass --quick to every script (smoke test)")
    ap.add_argument("--runs", type=int, default=3, help="runs per configuration of the solve benchmarks")
    ap.add_argument("--skip", nargs="+", default=[], choices=list(SCRIPTS))
    ap.add_argument("--only", nargs="+", default=[], choices=list(SCRIPTS))
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    names = [n for n in (args.only or SCRIPTS) if n not in args.skip]
    ran = {} if args.report_only else {n: run_script(n, args.quick, args.runs) for n in names}
    results = {name: load(name) for name in SCRIPTS}
    quick = args.quick or any(doc and doc.get("quick") for doc in results.values())
    text = section(results, ran, quick)
    write_section(text)
    print(f"\n{text}\n\nupdated {BENCHMARKS_MD}")
    failed = [n for n, r in ran.items() if r["exit"] != 0]
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
