"""Run the native extension's tests against a sanitized build of it (``make c-check``).

Usage: LD_PRELOAD="libasan.so libubsan.so" python tests/native/run_sanitized.py BUILD.so
The module at BUILD.so (built with -fsanitize=address,undefined by the Makefile) is
registered as ``rlinkd.daemon.inference._native`` before anything imports it, so the tests
exercise it instead of the optimised build; any report fails the run.
"""
from __future__ import annotations

import importlib.util
import sys

import pytest

NAME = "rlinkd.daemon.inference._native"


def main(path: str) -> int:
    spec = importlib.util.spec_from_file_location(NAME, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[NAME] = module
    from rlinkd.daemon.inference import netnative
    assert netnative.native_module() is module, "the optimised build was imported first"
    return int(pytest.main(["-q", "-p", "no:cacheprovider", "--capture=sys",  # (reports go to fd 2)
                            "tests/unit/test_netnative.py",
                            "tests/unit/test_lonestep.py",
                            "tests/unit/test_inference_server.py",
                            "tests/unit/test_direct_native.py",
                            "tests/unit/test_direct_connections.py",
                            "tests/unit/test_direct_fuzz.py",
                            "tests/unit/test_native_agrees.py",
                            "tests/unit/test_native_parts.py",
                            "tests/unit/test_recurrent_serving.py",  # (served through NativeStep)
                            "-k", "lane_scan or lonestep or netnative or native or recurrent"]))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
