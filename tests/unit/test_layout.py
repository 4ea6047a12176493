"""Import names: everything is imported as ``rlinkd.<folder>``, so an installed rlinkd never
collides with another distribution's top-level ``daemon`` (python-daemon) or ``shm``."""
from __future__ import annotations

import ast
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import REPO

PACKAGES = ("daemon", "shm", "client_lib")
SOURCES = (*PACKAGES, "tests", "bench")


def _py_files(*folders: str) -> list[Path]:
    return [p for folder in folders for p in sorted((REPO / folder).rglob("*.py"))]


def _imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def test_no_source_imports_a_bare_top_level_package():
    bare = [f"{p.relative_to(REPO)}: {name}" for p in _py_files(*SOURCES)
            for name in _imported_modules(p) if name.split(".")[0] in PACKAGES]
    assert bare == [], "import these through the rlinkd. namespace"


def test_pyproject_lists_every_package_folder():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    declared = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
                   ["packages"])
    folders = {"rlinkd." + ".".join(init.parent.relative_to(REPO).parts)
               for folder in PACKAGES for init in (REPO / folder).rglob("__init__.py")}
    assert declared == folders


@pytest.fixture(scope="module")
def wheel_build(tmp_path_factory) -> tuple[Path, str]:
    """The wheel and what pip printed while building it (the build backend's warnings included)."""
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-w", str(out), str(REPO)], check=True, capture_output=True, text=True)
    return next(out.glob("rlinkd-*.whl")), done.stdout + done.stderr


@pytest.fixture(scope="module")
def wheel(wheel_build) -> Path:
    return wheel_build[0]


def test_the_build_has_no_package_layout_warning(wheel_build):
    """Every folder under a package is either declared or no package data: no setuptools
    "Package '...' is absent from the `packages` configuration" banner at install."""
    assert "is absent from the `packages` configuration" not in wheel_build[1]


def test_the_wheel_installs_only_under_rlinkd(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"rlinkd"}
    expected = {"rlinkd/" + str(p.relative_to(REPO)) for p in _py_files(*PACKAGES)}
    assert expected <= set(names)


def test_rlinkd_works_beside_another_distributions_daemon_package(wheel, tmp_path):
    """Unpacked like site-packages, next to a stand-in for python-daemon's ``daemon``."""
    zipfile.ZipFile(wheel).extractall(tmp_path)
    (tmp_path / "daemon").mkdir()
    (tmp_path / "daemon" / "__init__.py").write_text("DaemonContext = 'python-daemon'\n")
    code = ("import sys; sys.path[:0] = [sys.argv[1], *sys.argv[2:]];"
            "import daemon, rlinkd.daemon.cli, rlinkd.daemon.supervisor, rlinkd.shm.ring,"
            " rlinkd.client_lib.agent;"
            "assert daemon.DaemonContext == 'python-daemon';"
            "assert rlinkd.daemon.cli.__file__.startswith(sys.argv[1]), rlinkd.daemon.cli.__file__;"
            "print('ok')")
    # -S: no .pth processing, so the editable install of this checkout is not on the path
    done = subprocess.run([sys.executable, "-S", "-c", code, str(tmp_path),
                           *site.getsitepackages()], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def _marks_serial(path: Path) -> bool:
    """Some decorator or ``pytestmark`` of the module is ``pytest.mark.serial``."""
    return any(isinstance(node, ast.Attribute) and node.attr == "serial"
               and ast.unparse(node.value) == "pytest.mark"
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))))


def test_serial_tests_live_where_make_test_collects_them():
    """`make test` runs the `serial` tests in a second pass that collects only the
    tests/process files whose text says ``mark.serial`` (SERIAL_FILES, a grep): every module
    that marks a test serial is among them."""
    marked = {p.relative_to(REPO) for p in (REPO / "tests").rglob("test_*.py") if _marks_serial(p)}
    assert marked and all(p.parts[:2] == ("tests", "process") for p in marked), marked
    grepped = {p.relative_to(REPO) for p in (REPO / "tests" / "process").glob("*.py")
               if "mark.serial" in p.read_text(encoding="utf-8")}
    assert marked <= grepped, marked - grepped
    makefile = (REPO / "Makefile").read_text()
    assert 'SERIAL_FILES = $(shell grep -l "mark\\.serial" tests/process/*.py)' in makefile
    assert "-m serial $(SERIAL_FILES)" in makefile
