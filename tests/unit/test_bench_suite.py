"""The benchmark suite's declarations: what run_all runs exists, paths are relative to the repo."""
from __future__ import annotations

import importlib.util
import os

from bench.harness import common
from bench.scenarios import SUITE
from tests.helpers import REPO


def test_every_suite_entry_names_a_module_or_test_file_that_exists():
    for name, scenario in SUITE.items():
        if scenario.module == "pytest":
            files = [a for a in scenario.full + scenario.quick if a.endswith(".py")]
            assert files and all((REPO / f).exists() for f in files), (name, files)
        else:
            assert importlib.util.find_spec(scenario.module) is not None, (name, scenario.module)


def test_no_bench_source_names_a_machine_path():
    for path in (REPO / "bench").rglob("*.py"):
        assert "/work/" not in path.read_text(), path


def test_rllib_anchors_are_found_beside_the_repository():
    if not os.environ.get("ANCHORS_DIR"):
        assert common.ANCHORS == REPO.parent / "shared" / "anchors" / "rllib"
    assert common.RESULTS == REPO / "bench" / "results"
