"""README.md: short, its links resolve, its Python example compiles and its C example compiles
against the C client's header (the documentation site's strict build checks the same links and
their anchors; this runs without mkdocs)."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.helpers import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
MAX_LINES = 250


def block(language: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)
    assert len(blocks) == 1, f"expected one {language} block in the README"
    return blocks[0]


def test_the_readme_is_short():
    assert len(README.splitlines()) <= MAX_LINES


def test_every_relative_link_resolves():
    targets = re.findall(r"\]\((?!https?:|#)([^)\s#]+)", README)
    assert targets, "the README links into docs/"
    missing = [t for t in targets if not (REPO / t).is_file()]
    assert missing == []


def test_the_python_example_compiles():
    compile(block("python"), "README.md", "exec")


def test_the_c_example_compiles(tmp_path):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) is installed")
    source = tmp_path / "example.c"
    source.write_text(block("c"))
    subprocess.run(["cc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-c",
                    f"-I{REPO / 'client_lib' / 'c' / 'include'}", str(source), "-o", str(tmp_path / "example.o")],
                   check=True, capture_output=True, timeout=60)
