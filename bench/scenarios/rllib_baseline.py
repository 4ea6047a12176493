"""RLlib baseline: RLlib's RLlink example (PPO, CartPole-v1) measured from outside.

    .venv/bin/python -m bench.scenarios.rllib_baseline [--runs 3] [--versions 2.48.0 2.60.0]
                                             [--modes example external] [--timeout 960] [--quick]

Runs the shared anchor scripts in ``<repo>/../shared/anchors/rllib`` (``ANCHORS_DIR``
overrides; read their README): each run is
``run_anchor.sh --ray V --mode M --runs 1 --timeout T``, which starts ray's processes under
``monitor.py`` (psutil samples of the whole process tree every second) in the venvs under
``/tmp/anchor-rllib`` (ray <= 2.48: ``venv/legacy-<ver>``, JSON + ONNX; ray >= 2.49:
``venv``, msgpack). A version whose venv is missing is installed by run_anchor.sh (unless
``--no-install``); one that cannot be installed is skipped with the reason.

Two definitions of solved, as for rlinkd (``bench.scenarios.rlinkd_solve``):

- ``example``: ray's example script as shipped (its built-in dummy client), stopped by its
  own criterion - RLlib's ``episode_return_mean`` >= 450. Figures from ``summarize.py``
  (Tune's result.json + monitor.json): wall = launch → timestamp of the first iteration at
  450 (Tune timestamps have 1-s resolution), env steps = ``num_env_steps_sampled_lifetime``
  at that iteration.
- ``external``: ``rllib_server.py`` (same PPO config, no built-in client, no reward stop) +
  ``rllib_client.py`` (RLlib's own dummy client in a separate process) launched together;
  solved when the client-side mean of the last 100 complete episodes is >= 450 (at least 10
  episodes). wall and env steps from the client's ``reached`` line (its clock starts at its
  own launch, the server starting at the same moment).

Per run: env steps/s = env steps / wall; peak RSS = monitor's peak summed RSS (external:
server tree + client, summed peaks); CPU s per 100k env steps = CPU seconds of every
process monitored (whole run, start-up included) / env steps sampled in the run × 1e5.
Every run records its learning curve (``curve``, ``bench.harness.curves``): example mode
from Tune's result.json (``episode_return_mean`` per iteration, 1-s timestamps), external
mode from the client's progress lines (last-100 mean every 5 s). Writes
``bench/results/rllib.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from bench.harness.common import ANCHOR_ROOT, ANCHORS, RESULTS, fmt_mr, median_range, print_table, write_result
from bench.harness.curves import make_curve

VERSIONS = ("2.48.0", "2.60.0")
MODES = ("example", "external")
INSTALL_TIMEOUT_S = 3600


# ---------------------------------------------------------------- venvs
def venv_python(version: str) -> Path:
    """Where run_anchor.sh puts the venv of ``version`` (VENV overrides, as there)."""
    if os.environ.get("VENV"):
        return Path(os.environ["VENV"]) / "bin" / "python"
    major_minor = tuple(int(x) for x in version.split(".")[:2])
    base = ANCHOR_ROOT / "venv" if major_minor >= (2, 49) else ANCHOR_ROOT / "venv" / f"legacy-{version}"
    return base / "bin" / "python"


def venv_problem(version: str) -> str | None:
    """None when the venv imports the right ray; else why not."""
    py = venv_python(version)
    if not py.exists():
        return f"{py} does not exist"
    try:
        out = subprocess.run([str(py), "-c", "import ray; print(ray.__version__)"], capture_output=True,
                             text=True, timeout=300, env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0"))
    except subprocess.TimeoutExpired:
        return f"{py}: importing ray timed out"
    found = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if out.returncode != 0 or found != version:
        return f"{py}: import ray gave {found or out.stderr.strip()[-300:]!r}, expected {version}"
    return None


def ensure_venv(version: str, install: bool) -> str | None:
    """Check the venv; let run_anchor.sh create it when missing (``--runs 0``: install only)."""
    problem = venv_problem(version)
    if problem is None or not install:
        return problem
    print(f"  {problem}; installing with run_anchor.sh (minutes; needs PyPI)", flush=True)
    try:
        proc = subprocess.run(["bash", str(ANCHORS / "run_anchor.sh"), "--ray", version, "--runs", "0"],
                              capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"installing ray {version} timed out after {INSTALL_TIMEOUT_S} s"
    if proc.returncode != 0:
        return f"run_anchor.sh could not install ray {version}: {(proc.stdout + proc.stderr)[-500:]}"
    return venv_problem(version)


# ---------------------------------------------------------------- one anchor run
def wait_ports_free(ports=(5555, 5556), timeout_s: float = 300.0, quiet_s: float = 3.0) -> bool:
    """run_anchor.sh refuses to start while anything listens on 127.0.0.1:5555/5556 (it asks
    ``ss -ltn``). Ray's EnvRunner actors outlive the signalled process group for a while, so
    wait until ``ss`` shows neither port for ``quiet_s`` in a row."""
    deadline, free_since = time.monotonic() + timeout_s, None
    alternatives = "|".join(map(str, ports))
    pattern = re.compile(rf"127\.0\.0\.1:({alternatives})\s")
    while time.monotonic() < deadline:
        out = subprocess.run(["ss", "-ltn"], capture_output=True, text=True).stdout
        if pattern.search(out):
            free_since = None
        elif free_since is None:
            free_since = time.monotonic()
        elif time.monotonic() - free_since >= quiet_s:
            return True
        time.sleep(0.5)
    return False


def anchor_run(version: str, mode: str, timeout_s: float) -> dict:
    """Run run_anchor.sh once; returns the parsed figures (``error`` when it failed)."""
    wait_ports_free()
    started = time.time()
    cmd = ["bash", str(ANCHORS / "run_anchor.sh"), "--ray", version, "--mode", mode, "--runs", "1",
           "--timeout", str(int(timeout_s))]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s + 600)
    except subprocess.TimeoutExpired:
        return {"error": f"run_anchor.sh did not finish within {timeout_s + 600:.0f} s", "solved": False}
    out = proc.stdout + proc.stderr
    match = re.search(r"^== run 1/1 -> (\S+)$", out, re.M)
    if not match:
        return {"error": f"run_anchor.sh exited {proc.returncode} before a run: {out[-600:]}", "solved": False}
    outd = Path(match.group(1))
    (outd / "run_anchor.log").write_text(out)
    parse = parse_example if mode == "example" else parse_external
    return parse(outd, started) | {"run_dir": str(outd)}


def _newest_trial(started: float) -> Path | None:
    """The PPO trial directory Tune created during this run (as run_anchor.sh finds it)."""
    root = ANCHOR_ROOT / "home" / "ray_results"
    trials = [p for p in root.glob("*/PPO_*") if p.is_dir() and p.stat().st_mtime >= started - 1]
    return max(trials, key=lambda p: p.stat().st_mtime, default=None)


def parse_example(outd: Path, started: float) -> dict:
    """Figures of an ``example`` run from summarize.py (result.json + monitor.json)."""
    monitor = _read_json(outd / "monitor.json")
    trial = _newest_trial(started)
    if trial is None or not (trial / "result.json").exists():
        return {"error": "no Tune trial with result.json was written", "solved": False, "monitor": monitor}
    proc = subprocess.run([sys.executable, str(ANCHORS / "summarize.py"), str(outd), str(trial)],
                          capture_output=True, text=True, timeout=120)
    summ = json.loads(proc.stdout)
    solved = bool(summ.get("reached_target"))
    wall = summ.get("hit_wall_s_since_launch") if solved else None
    steps = summ.get("hit_env_steps") if solved else summ.get("last_env_steps")
    cpu = monitor.get("cpu_s_total_tree")
    return _figures(solved, wall, steps, monitor.get("peak_rss_sum_MiB"), cpu, summ.get("last_env_steps")) | {
        "iterations": summ.get("iterations"), "best_return_mean": summ.get("best_return_mean"),
        "return_mean": summ.get("best_return_mean"),
        "rllib_trainable_steps_per_s": summ.get("env_steps_per_s_overall(trainable)"),
        "monitor_wall_s": monitor.get("wall_s"), "timed_out": monitor.get("timed_out"), "trial_dir": str(trial),
        "curve": make_curve(example_points(trial / "result.json", monitor.get("t0_epoch")))}


def parse_external(outd: Path, started: float) -> dict:
    """Figures of an ``external`` run: the client's progress lines + both monitors."""
    server, client = _read_json(outd / "server" / "monitor.json"), _read_json(outd / "client" / "monitor.json")
    events = [json.loads(line) for line in _lines(outd / "client_progress.jsonl")]
    reached = next((e for e in events if e.get("event") == "reached"), None)
    last = reached or (events[-1] if events else {})
    rss = _sum(server.get("peak_rss_sum_MiB"), client.get("peak_rss_sum_MiB"))
    cpu = _sum(server.get("cpu_s_total_tree"), client.get("cpu_s_total_tree"))
    iters = [json.loads(line) for line in _lines(outd / "server" / "stdout.log") if line.startswith('{"event": "iter"')]
    return _figures(reached is not None, last.get("t_s") if reached else None, last.get("env_steps"), rss, cpu,
                    last.get("env_steps")) | {
        "last_event": last.get("event"), "return_mean": last.get("return_mean_100"),
        "since_connect_s": last.get("since_connect_s"), "server_iterations": len(iters),
        "error": last.get("error"), "client_wall_s": client.get("wall_s"),
        "curve": make_curve((e["t_s"], e["env_steps"], e.get("return_mean_100")) for e in events
                            if e.get("event") in ("progress", "reached") and "t_s" in e)}


def example_points(result_json: Path, t0_epoch: float | None) -> list[tuple[float, float, float]]:
    """Tune's result.json, one line per training iteration: (s since launch, env steps sampled,
    ``episode_return_mean``). Tune's timestamps are whole seconds; no launch time, no curve."""
    if t0_epoch is None:
        return []
    points = []
    for line in _lines(result_json):
        row = json.loads(line)
        runners = row.get("env_runners") or {}
        steps = row.get("num_env_steps_sampled_lifetime", runners.get("num_env_steps_sampled_lifetime"))
        ret = runners.get("episode_return_mean")
        if steps is not None and ret is not None and ret == ret:
            points.append((row["timestamp"] - t0_epoch, steps, ret))
    return points


def _figures(solved: bool, wall_s, env_steps, rss_mb, cpu_s, cpu_steps) -> dict:
    """The keys every system reports (see bench.scenarios.rlinkd_solve.measures)."""
    return {"solved": solved, "wall_s": wall_s, "env_steps": env_steps,
            "steps_per_s": round(env_steps / wall_s, 1) if wall_s and env_steps else None,
            "peak_rss_mb": rss_mb, "cpu_s": cpu_s,
            "cpu_s_per_100k_steps": round(cpu_s / cpu_steps * 1e5, 2) if cpu_s and cpu_steps else None}


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _lines(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def _sum(*values):
    return None if any(v is None for v in values) else round(sum(values), 1)


# ---------------------------------------------------------------- driver and report
def summarize(runs: list[dict]) -> dict:
    solved = [r for r in runs if r.get("solved")]
    keys = ("wall_s", "env_steps", "steps_per_s", "peak_rss_mb", "cpu_s_per_100k_steps")
    return {k: median_range([r.get(k) for r in solved], 2) for k in keys} | {
        "solved_runs": len(solved), "runs": len(runs),
        "unsolved": [f"mean {r.get('return_mean')} after {r.get('env_steps') or 0:,} steps"
                     + (f" ({r['error'][:80]})" if r.get("error") else "") for r in runs if not r.get("solved")]}


def table(res: dict) -> str:
    rows = []
    for version, v in res["versions"].items():
        if v.get("skipped"):
            rows.append((f"ray {version}", f"skipped: {v['skipped']}", "", "", "", "", ""))
            continue
        for mode, m in v["modes"].items():
            s = m["summary"]
            note = f" (unsolved: {'; '.join(s['unsolved'])})" if s.get("unsolved") else ""
            rows.append((f"ray {version}, {mode}", f"{s['solved_runs']}/{s['runs']}{note}", fmt_mr(s["wall_s"], 1),
                         fmt_mr(s["env_steps"]), fmt_mr(s["steps_per_s"]), fmt_mr(s["peak_rss_mb"]),
                         fmt_mr(s["cpu_s_per_100k_steps"], 1)))
    return print_table("RLlib RLlink example, CartPole-v1 to 450 (median (min – max))",
                       ("version, definition", "solved", "wall s", "env steps", "steps/s", "peak RSS MiB",
                        "CPU s / 100k steps"), rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--versions", nargs="+", default=list(VERSIONS))
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--timeout", type=float, default=960.0, help="per run, seconds (run_anchor.sh --timeout)")
    ap.add_argument("--no-install", action="store_true", help="skip a version whose venv is missing")
    ap.add_argument("--quick", action="store_true",
                    help="one external-mode run of 2.48.0 with a 90 s timeout (checks the parsing)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the other versions/modes already in bench/results/rllib.json")
    args = ap.parse_args()
    if args.quick:
        args.versions, args.modes, args.runs, args.timeout = ["2.48.0"], ["external"], 1, min(args.timeout, 90.0)
    res: dict = {"quick": args.quick, "timeout_s": args.timeout, "versions": {}}
    if args.merge and (RESULTS / "rllib.json").exists():
        res = json.loads((RESULTS / "rllib.json").read_text())
        res["merged_into"] = res.pop("command", "")  # the run whose other cells are kept
    for version in args.versions:
        problem = ensure_venv(version, not args.no_install)
        if problem:
            print(f"ray {version}: SKIPPED - {problem}", flush=True)
            res["versions"][version] = {"skipped": problem}
            continue
        res["versions"].setdefault(version, {"python": str(venv_python(version)), "modes": {}})
        for mode in args.modes:
            runs = []
            for i in range(args.runs):
                print(f"ray {version} {mode} run {i + 1}/{args.runs} (timeout {args.timeout:.0f} s)", flush=True)
                runs.append(anchor_run(version, mode, args.timeout))
                r = runs[-1]
                print(f"  solved={r.get('solved')} wall={r.get('wall_s')} s steps={r.get('env_steps')} "
                      f"rss={r.get('peak_rss_mb')} MiB {r.get('error') or ''}", flush=True)
            if args.merge:  # keep the cell's earlier successful runs, add these
                old = res["versions"][version]["modes"].get(mode, {}).get("runs", [])
                runs = [r for r in old if r.get("solved")] + runs
            res["versions"][version]["modes"][mode] = {"runs": runs, "summary": summarize(runs)}
    res["table_markdown"] = table(res)
    write_result("rllib", res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
