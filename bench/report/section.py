"""Blocks of BENCHMARKS.md computed from result files (``bench.report.today`` places them).

One met/MISSED line per target (every target declared once in ``bench.report.targets``), the
rlinkd/RLlib ratios and the reliability table; ``load`` reads a SUITE scenario's result file.
"""
from __future__ import annotations

import json

from bench.harness.common import RESULTS, fmt_num
from bench.report import targets
from bench.scenarios import SUITE


def load(name: str) -> dict | None:
    path = RESULTS / SUITE[name].result_file
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


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
                rows.append((label, f"ray {version}", key.replace("x", " × "),
                             ratio(_median(s, "wall_s"), _median(r, "wall_s")),
                             ratio(_median(s, "env_steps"), _median(r, "env_steps")),
                             ratio(_median(s, "steps_per_s"), _median(r, "steps_per_s")),
                             ratio(_median(s, "peak_rss_mb"), _median(r, "peak_rss_mb"))))
    return rows


def md_table(header: tuple, rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def transport_target_lines(transport: dict | None) -> list[str]:
    """Issue 3's targets (shared-memory throughput, wake-up, idle CPU) from transport.json."""
    t = transport or {}
    idle = t.get("idle_cpu") or {}
    measured = [
        (targets.SHM_SINGLE, _median(t, "shm_single", "steps_per_s"), lambda v: f"{fmt_num(v)} steps/s", ""),
        (targets.SHM_BATCH, _median(t, "shm_batch", "steps_per_s"), lambda v: f"{fmt_num(v)} steps/s", ""),
        (targets.WAKEUP_P50, (t.get("wakeup_fifo_us") or {}).get("p50"), lambda v: f"{v} µs", ""),
        (targets.IDLE_CPU, idle.get("cpu_percent_of_one_core"), lambda v: f"{v:.2f} %",
         f", {idle.get('clients', 8)} silent shm clients"),
    ]
    return [target.line(value, "" if value is None else show(value), context)
            for target, value, show, context in measured]


def image_target_lines(image: dict | None) -> list[str]:
    """Issue 10's image ingest targets from image_ingest.json, each beside its limit."""
    img = image or {}
    lines = []
    for target, path, limit, limit_name in ((targets.IMAGE_SHM, "shm", "memcpy_steps_per_s", "one memcpy"),
                                            (targets.IMAGE_TCP, "tcp", "decode_steps_per_s",
                                             "orjson.loads + b64decode")):
        value, bound = _median(img, path, "steps_per_s"), _median(img, path, limit)
        context = f" (limit: {limit_name} {fmt_num(bound)} steps/s)" if bound else ""
        lines.append(target.line(value, "" if value is None else f"{fmt_num(value)} steps/s", context))
    return lines


DEFINITIONS = (("own", "example", "own stop criterion"), ("client", "external", "client-side last-100"))


def _median(doc: dict | None, *keys: str):
    """``doc[k1][k2]...["median"]``, None when any level is missing."""
    for key in keys:
        doc = (doc or {}).get(key)
    return (doc or {}).get("median")


def solve_target_lines(solve: dict | None, rllib: dict | None) -> list[str]:
    """Issue 5's targets, per definition of solved: rlinkd's configurations against the best RLlib."""
    if not solve or not rllib:
        return ["- time-to-solve targets: **not measured** (rlinkd_solve or rllib results missing)"]
    out = []
    for crit, mode, label in DEFINITIONS:
        theirs = [((v.get("modes") or {}).get(mode) or {}).get("summary") for v in rllib["versions"].values()]
        theirs = [t for t in theirs if t and t.get("solved_runs")]
        ours = {k.replace("x", " × "): (v or {}).get("summary") for k, v in (solve.get(crit) or {}).items()}
        for target in targets.SOLVE:
            line = _relative_line(target, label, theirs, ours)
            if line:
                out.append(line)
    return out


def _relative_line(target: targets.RelativeTarget, label: str, theirs: list[dict], ours: dict) -> str | None:
    """One definition's line for one relative target (None when RLlib has no figure)."""
    key = target.measure
    values = [_median(t, key) for t in theirs if _median(t, key)]
    if not values:
        return None
    bound = target.bound(values)
    met = [c for c, o in ours.items() if _median(o, key) is not None and target.met(_median(o, key), bound)]
    verdict = "met" if len(met) == len(ours) else "MISSED" if not met else f"met by {', '.join(met)} only"
    show = (lambda v: f"{v:.1f} s") if key == "wall_s" else fmt_num
    got = ", ".join(f"{c} {show(_median(o, key))}" for c, o in ours.items())
    return f"- {label}: {target.text()} (bound {show(bound)}): rlinkd {got} — **{verdict}**"


def latency_target_lines(latency: dict | None, solve: dict | None) -> list[str]:
    """SET_STATE p50, 64-client p99 (saturated and paced), RLlib 2.48's dummy client solving."""
    out = []
    if latency:
        p50 = latency["set_state_reply"]["on_policy"]["excluding_training_ms"]["p50"]
        out.append(targets.SET_STATE_P50.line(p50, f"{p50} ms"))
        for p in (q for q in latency["scaling"]["collector"] if q["clients"] == 64):
            p99 = p["reply_ms"]["p99"]
            out.append(targets.CLIENTS_64_P99.line(p99, f"{p99} ms", ", closed loop at saturation"))
        for p in latency["scaling"].get("paced") or []:
            p99 = p["reply_ms"]["p99"]
            out.append(targets.CLIENTS_64_P99.line(p99, f"{p99} ms",
                                                   f", paced at {p['offered_load']:.0%} of capacity"))
    rc = ((solve or {}).get("rllib_client") or {}).get("summary")
    if rc:
        share = 100 * rc["solved_runs"] / rc["runs"] if rc["runs"] else None
        out.append(targets.RLLIB_CLIENT_SOLVED.line(
            share, f"{rc['solved_runs']}/{rc['runs']} runs, {fmt_num(_median(rc, 'wall_s'))} s"))
    return out


def flood_target_lines(flood: dict | None) -> list[str]:
    """Issue 15's target: a real client's handshake with the flood open (median of the runs)."""
    median = ((flood or {}).get("flooded_ms") or {}).get("median")
    sockets = (flood or {}).get("sockets", 1000)
    context = "" if sockets == 1000 else f" (measured with {sockets:,} sockets)"
    return [targets.FLOOD_HANDSHAKE.line(median, f"{median} ms", context)]


def reliability_rows(fuzz: dict | None, soak: dict | None, chaos: dict | None) -> list[tuple]:
    """Issue 6's table: fuzzing, soak, chaos, one row per figure."""
    rows, rss = [], targets.SOAK_RSS_GROWTH
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
                 ("soak", f"summed RSS growth after warm-up (limit {rss.bound:g} {rss.unit})",
                  f"{soak['rss_growth'] * 100:.1f} % ({soak['rss_mb_start_end'][0]} → "
                  f"{soak['rss_mb_start_end'][1]} MB) — "
                  f"{'met' if rss.met(soak['rss_growth'] * 100) else 'MISSED'}"),
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
