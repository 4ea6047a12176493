"""`rlinkd demo` solves CartPole-v1 with two TCP clients (the README's first command)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = [pytest.mark.process, pytest.mark.slow]


def test_demo_solves_cartpole(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "rlinkd.daemon.cli", "demo", "--clients", "2", "--timeout-s", "300",
         "--state-dir", str(tmp_path / "demo")],
        capture_output=True, text=True, timeout=400, cwd=REPO, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert sum("mean return (last 20)" in line for line in lines) >= 2  # visible progress
    assert lines[-1].startswith("SOLVED ")
    assert '"daemon_exit": 0' in lines[-1]
