"""Are the defaults no slower than the CPU? ``rlinkd demo`` with defaults against a forced CPU.

    .venv/bin/python -m bench.scenarios.device_defaults [--runs 3] [--clients 4] [--target 450]
        [--timeout-s 900] [--quick] [--out FILE]

Two pairs (issue 32), each run ``rlinkd demo --clients 4`` to the demo's target (the daemon's
mean return of the last 20 episodes >= 450, CartPole-v1) and timed by the demo itself
(``wall_s``: daemon start to solved):

- ``learner``: defaults (``learner.device = auto``) against ``--set learner.device=cpu``;
- ``serving``: ``--inference server`` with defaults (``inference.backend = auto``) against
  the same with ``--set inference.backend=native``.

Runs are interleaved (run i: default, forced, for each pair; seed i for both sides), so load
on the host falls on both sides alike. Per pair: the median time to solve of each side, and
the ratio default / forced, checked against ``RATIO_BOUND`` (<= 1.05: the default may not be
slower). Each run also records what the defaults chose, read from the daemon's log
(``learner_device`` and ``inference_backend`` events).

Without a CUDA device the scenario still runs, but no GPU is in play: ``auto`` resolves to
the CPU without timing (``choice = only_cpu``), so the learner pair's sides are one
configuration, and torch on CUDA is no serving candidate, so the serving pair's default picks
among the CPU backends only (it may pair native with onnxruntime for large batches): the
ratios are the host's noise and the CPU backends' choice, not a GPU figure; the output and
the result say so. ``--quick``: one run to mean return 200, a plumbing check. Results go
to ``bench/results/device_defaults.json``.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.harness.common import fmt_num, print_table, write_result
from rlinkd.daemon.inference.backend import cuda_present
from rlinkd.daemon.launch import LOG_FILE, rlinkd_command

RATIO_BOUND = 1.05
"""Median time to solve with defaults over that with the forced CPU choice (issue 32)."""
PAIRS = {  # pair -> (demo arguments of both sides, the forced side's override)
    "learner": ([], "learner.device=cpu"),
    "serving": (["--inference", "server"], "inference.backend=native"),
}
CHOICE_EVENTS = ("learner_device", "inference_backend")


def demo(args: list[str], clients: int, seed: int, target: float, timeout_s: float) -> dict:
    """One ``rlinkd demo`` run: its summary line (``solved``, ``wall_s``, ...) and the
    choices its daemon logged (``choices``: the ``CHOICE_EVENTS`` lines)."""
    state = Path(tempfile.mkdtemp(prefix="rlinkd-devdef-"))
    try:
        cmd = rlinkd_command("demo", "--clients", str(clients), "--seed", str(seed), "--target", str(target),
                             "--timeout-s", str(timeout_s), "--state-dir", str(state), *args)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s + 180).stdout
        last = [ln for ln in out.splitlines() if ln.startswith(("SOLVED ", "NOT SOLVED "))]
        if not last:
            raise RuntimeError(f"rlinkd demo printed no summary: {out[-2000:]}")
        summary = json.loads(last[-1][last[-1].index("{"):])
        return summary | {"choices": logged_choices(state / LOG_FILE)}
    finally:
        shutil.rmtree(state, ignore_errors=True)


def logged_choices(log: Path) -> list[dict]:
    """The daemon log's ``learner_device`` and ``inference_backend`` events (JSON lines)."""
    found = []
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if any(e in line for e in CHOICE_EVENTS):
            try:
                found.append(json.loads(line))
            except ValueError:
                continue  # a line that mentions the name but is not a JSON event
    return [c for c in found if c.get("event") in CHOICE_EVENTS]


def _median_solved(runs: list[dict]) -> float | None:
    walls = [r["wall_s"] for r in runs if r["solved"]]
    return statistics.median(walls) if walls else None


def pair_summary(default: list[dict], forced: list[dict]) -> dict:
    """Median time to solve per side (unsolved runs count as missing), their ratio, the check."""
    d, f = _median_solved(default), _median_solved(forced)
    ratio = round(d / f, 3) if d and f else None
    return {"default_wall_s": d, "forced_wall_s": f, "ratio": ratio, "bound": RATIO_BOUND,
            "met": None if ratio is None else ratio <= RATIO_BOUND,
            "solved": f"{sum(r['solved'] for r in default)}/{len(default)} and "
                      f"{sum(r['solved'] for r in forced)}/{len(forced)}"}


def check_cell(met: bool | None, cuda: bool) -> str:
    """The table's check: met or MISSED; without CUDA no check (no GPU in play)."""
    if not cuda:
        return "not measured on a GPU (no CUDA)"
    return {True: "met", False: "**MISSED**", None: "– (a side never solved)"}[met]


def host_note(cuda: bool, gpu_device: bool) -> str:
    """What the defaults can choose on this host, in one sentence."""
    if cuda:
        return "torch sees a CUDA device: auto times the CPU against it; torch on CUDA is a serving candidate."
    serving = ("torch on CUDA is a serving candidate (/dev/nvidiactl exists)" if gpu_device else
               "torch on CUDA is no serving candidate")
    return (f"torch sees no CUDA device: learner.device = auto resolves to cpu (only_cpu), so the learner "
            f"pair's sides are one configuration, and {serving}, so the serving pair's default picks among "
            "the CPU backends only; the ratios are this host's noise, not a GPU figure (not measured on a GPU).")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per side of each pair (median)")
    ap.add_argument("--clients", type=int, default=4, help="demo clients")
    ap.add_argument("--target", type=float, default=450.0, help="demo target (mean return of the last 20)")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="per demo run")
    ap.add_argument("--quick", action="store_true", help="1 run per side to mean return 200 (plumbing check)")
    ap.add_argument("--out", default=None, help="result file (default bench/results/device_defaults.json)")
    args = ap.parse_args()
    runs, target = (1, 200.0) if args.quick else (args.runs, args.target)
    import torch  # (the daemon's learner imports it anyway; here only to ask for CUDA)
    cuda = torch.cuda.is_available()
    note = host_note(cuda, cuda_present())
    print(note, flush=True)
    sides: dict[str, dict[str, list]] = {p: {"default": [], "forced": []} for p in PAIRS}
    for i in range(runs):
        for pair, (base, forced) in PAIRS.items():
            for side, extra in (("default", []), ("forced", ["--set", forced])):
                r = demo([*base, *extra], args.clients, i, target, args.timeout_s)
                sides[pair][side].append(r)
                chosen = [{k: c[k] for k in ("event", "device", "how", "backend") if k in c} for c in r["choices"]]
                print(f"run {i + 1} {pair} {side}: solved {r['solved']} in {r['wall_s']} s; chose {chosen}",
                      flush=True)
    summary = {p: pair_summary(s["default"], s["forced"]) for p, s in sides.items()}
    table = print_table(f"rlinkd demo --clients {args.clients} to mean return {target:g}, median of {runs}",
                        ("pair", "defaults", "forced", "ratio", f"<= {RATIO_BOUND}"),
                        [(p, f"{fmt_num(s['default_wall_s'], 1)} s", f"{fmt_num(s['forced_wall_s'], 1)} s",
                          fmt_num(s["ratio"], 3), check_cell(s["met"], cuda))
                         for p, s in summary.items()])
    write_result("device_defaults", {"runs": runs, "clients": args.clients, "target": target,
                                     "quick": args.quick, "cuda": cuda, "gpu_device_file": cuda_present(),
                                     "host_note": note, "pairs": {p: {"args": b, "forced": f} for p, (b, f)
                                                                  in PAIRS.items()},
                                     "summary": summary, "runs_by_pair": sides, "table_markdown": table},
                 args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
