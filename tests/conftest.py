"""Shared fixtures. Every daemon started here is checked at teardown: it stopped
with exit 0 and left no child process and no shared-memory segment behind."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.helpers import REPO, DaemonProcess

BENCH_RESULTS = REPO / "bench" / "results"
C_DIR = REPO / "client_lib" / "c"


def _results_snapshot() -> dict[str, tuple[int, int]]:
    """{file name: (size, mtime_ns)} of everything under bench/results."""
    return {str(p.relative_to(BENCH_RESULTS)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in BENCH_RESULTS.rglob("*") if p.is_file()}


@pytest.fixture(scope="session", autouse=True)
def bench_results_untouched():
    """The test run must not create or modify files under bench/results (published figures):
    tests that run a benchmark write into tmp_path. Fails at the end of the session."""
    before = _results_snapshot()
    yield
    after = _results_snapshot()
    changed = sorted(name for name in after.keys() | before.keys() if after.get(name) != before.get(name))
    assert not changed, f"the test run created or modified bench/results files: {changed}"


TIER_ORDER = {"process": 0, "wiring": 1, "unit": 2}


def pytest_collection_modifyitems(items) -> None:
    """Real-process files first, then wiring, then units (stable within a tier): pytest-xdist
    (`make test`) shares the tests out in this order, so the long files start early and the
    many short unit tests even out the end of the run."""
    def tier(item) -> int:
        parts = item.path.relative_to(REPO / "tests").parts
        return TIER_ORDER.get(parts[0], len(TIER_ORDER)) if len(parts) > 1 else len(TIER_ORDER)
    items.sort(key=tier)


class DaemonPool:
    """Starts daemons; ``close`` stops them all and reports what went wrong."""

    def __init__(self, base) -> None:
        self.base, self.started = base, []

    def start(self, *args: str, name: str = "state", check_clean_exit: bool = True,
              env: dict | None = None) -> DaemonProcess:
        d = DaemonProcess(self.base / name, list(args), env=env)
        d.check_clean_exit = check_clean_exit
        self.started.append(d)
        return d.start()

    def close(self) -> None:
        problems = []
        for d in self.started:
            code = d.stop()
            leftovers, segments = d.leftover_children(), d.leftover_segments()
            d.kill_leftovers()
            if d.check_clean_exit and code != 0:
                problems.append(f"daemon exit code {code}\n{d.log()[-4000:]}")
            if leftovers or segments:
                problems.append(f"left behind: processes {leftovers}, segments {segments}")
        assert not problems, "\n".join(problems)


@pytest.fixture
def daemon_factory(tmp_path):
    pool = DaemonPool(tmp_path)
    yield pool.start
    pool.close()


@pytest.fixture
def daemon(daemon_factory):
    """One daemon with default settings on an ephemeral port (per test)."""
    return daemon_factory()


@pytest.fixture(scope="module")
def shared_daemon(tmp_path_factory):
    """One daemon shared by a module's tests (for tests that do not change its state)."""
    pool = DaemonPool(tmp_path_factory.mktemp("shared"))
    yield pool.start()
    pool.close()


@pytest.fixture
def shm_dir(request):
    """A fresh directory on /dev/shm (tmpfs, where the daemon's segments live), removed
    with whatever is left in it after the test. Named after the test module."""
    module = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    directory = tempfile.mkdtemp(prefix=f"rlkt-{module}-", dir="/dev/shm")
    yield directory
    shutil.rmtree(directory)


@pytest.fixture(scope="session")
def c_build(tmp_path_factory):
    """``c_build(*targets)``: the C client's Makefile targets (``all``, or paths under OUT such
    as ``san/cartpole``) built into one temporary OUT directory shared by the session, which
    is returned. make builds each object once for every test that needs it, on every core; a
    compiler error fails the test that asked."""
    out = tmp_path_factory.mktemp("c-build")

    def build(*targets: str) -> Path:
        names = [t if t == "all" else str(out / t) for t in targets]
        subprocess.run(["make", "-s", f"-j{os.cpu_count() or 1}", "-C", str(C_DIR), f"OUT={out}",
                        *names], check=True, capture_output=True, timeout=180)
        return out
    return build
