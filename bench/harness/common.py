"""Shared pieces of the benchmark scenarios: paths, statistics, result files, tables.

- paths: ``REPO``, ``RESULTS`` (``bench/results``), ``ANCHORS`` (the shared RLlib anchor
  scripts, ``<repo>/../shared/anchors/rllib`` unless ``ANCHORS_DIR`` says otherwise);
- statistics (``median_range``, ``percentiles``) and result files (``write_result``);
- markdown tables and number formats for BENCHMARKS.md.

Daemons are started with ``bench.harness.daemon``, raw RLlink frames come from
``bench.harness.rllink``. Only loopback addresses are used.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import numpy as np
REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
ANCHORS = Path(os.environ.get("ANCHORS_DIR") or REPO.parent / "shared" / "anchors" / "rllib")
"""RLlib anchor scripts (run_anchor.sh, rllib_client.py, ...), shared beside the repository."""
ANCHOR_ROOT = Path(os.environ.get("ANCHOR_ROOT", "/tmp/anchor-rllib"))
"""Where run_anchor.sh keeps its venvs and runs (its own default, overridable the same way)."""
LOOPBACK = "127.0.0.1"


# ---------------------------------------------------------------- statistics and results
def median_range(values: list[float], ndigits: int = 3) -> dict:
    """{"median", "min", "max", "n"} of the values (None entries are ignored)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": round(statistics.median(vals), ndigits), "min": round(min(vals), ndigits),
            "max": round(max(vals), ndigits), "n": len(vals)}


def percentiles(values: list[float], qs: tuple[int, ...] = (50, 90, 99), ndigits: int = 1) -> dict:
    """{"p50": .., "p99": .., "n": ..}: linear-interpolated percentiles (numpy default)."""
    if not values:
        return {f"p{q}": None for q in qs} | {"n": 0}
    arr = np.asarray(values, np.float64)
    return {f"p{q}": round(float(np.percentile(arr, q)), ndigits) for q in qs} | {
        "n": len(values), "max": round(float(arr.max()), ndigits)}


def write_result(name: str, payload: dict, out: str | Path | None = None) -> Path:
    """Write ``payload`` with the command, CPU count, time and load added to ``out``
    (default ``bench/results/<name>.json``, the file the report reads); prints the path.
    Called once at the end of a scenario's ``main``; the command is the running module's."""
    command = " ".join([".venv/bin/python -m", _running_module(), *sys.argv[1:]])
    doc = {"command": command, "cpu_count": os.cpu_count(),
           "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
           "load_avg_1m_at_end": round(os.getloadavg()[0], 2), **payload}
    path = Path(out) if out else RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=_json_default))
    print(f"wrote {path}", flush=True)
    return path


def _running_module() -> str:
    """``bench.scenarios.soak`` for ``python -m bench.scenarios.soak`` (from ``__main__``)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec.name if spec else Path(sys.argv[0]).stem


def client_load_parser(doc: str, result_name: str, tcp_clients: int, shm_clients: int) -> argparse.ArgumentParser:
    """Arguments of a scenario that runs a daemon with TCP and shared-memory clients
    (soak, chaos): ``--tcp-clients``, ``--shm-clients`` and ``--out`` (result file)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--tcp-clients", type=int, default=tcp_clients)
    ap.add_argument("--shm-clients", type=int, default=shm_clients)
    ap.add_argument("--out", help=f"result file (default: bench/results/{result_name}.json)")
    return ap


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (small race, loopback only)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- markdown
def print_table(title: str, header: tuple[str, ...], rows: list[tuple]) -> str:
    """Print (and return) a markdown table."""
    lines = [f"**{title}**", "", "| " + " | ".join(header) + " |",
             "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def fmt_num(value, digits: int = 0) -> str:
    """1234567.8 -> '1,234,568'; None -> '–'."""
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def fmt_mr(d: dict | None, digits: int = 0, scale: float = 1.0) -> str:
    """'median (min – max)' of a median_range dict."""
    if not d or d.get("median") is None:
        return "–"
    f = lambda v: fmt_num(v * scale, digits)  # noqa: E731
    if d.get("n", 1) <= 1:
        return f(d["median"])
    return f"{f(d['median'])} ({f(d['min'])} – {f(d['max'])})"
