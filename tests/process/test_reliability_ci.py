"""CI versions of the soak (30 s, 64 TCP + 8 shm clients) and chaos (6 kills) runs.

The soak's full run (600 s) is a benchmark (bench.scenarios.soak); the CI version checks
the same things on a shorter run: every acknowledged step ingested, RSS flat after the
warm-up (6-9 s against the last 3 s), no error line in the log."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = [pytest.mark.process, pytest.mark.slow]


def run_bench(tmp_path, module: str, *args: str, timeout_s: float) -> dict:
    """Run ``bench.scenarios.<module>`` writing its result into tmp_path (never bench/results)."""
    out = tmp_path / f"{module}-ci.json"
    result = subprocess.run([sys.executable, "-m", f"bench.scenarios.{module}", *args, "--out", str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=timeout_s,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return json.loads(out.read_text())


def test_soak_30s_sent_equals_ingested_rss_flat_no_errors(tmp_path):
    r = run_bench(tmp_path, "soak", "--duration-s", "30", timeout_s=600)
    assert r["passed"] and r["steps_sent"] == r["steps_ingested"] > 0
    assert len(r["clients"]) == 72 and not r["mismatched_clients"]
    assert r["rss_growth"] <= 0.10 and r["error_log_lines"] == []


def test_chaos_short_run_recovers_every_time(tmp_path):
    r = run_bench(tmp_path, "chaos", "--kills", "6", timeout_s=900)["summary"]
    assert r["passed"] and r["survived"] == r["kills"] == 6
    assert r["shm_leaks"] == [] and r["corrupt_checkpoints"] == [] and r["newest_loads"]
