"""The README's C++ and C# snippets for the C client compile against client_lib/c/include/rlinkd.h
(C# only where `mcs` is installed; the C++ check needs g++, which the C client's tests need anyway)."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.helpers import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
SECTION = README[README.index("## The C client"):README.index("## Evaluation clients")]


def snippet(language: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", SECTION, flags=re.S)
    assert len(blocks) == 1, f"expected one {language} block in the C client section"
    return blocks[0]


def test_the_cpp_snippet_compiles(tmp_path):
    source = tmp_path / "snippet.cpp"
    source.write_text(snippet("cpp"))
    subprocess.run(["g++", "-std=c++11", "-Wall", "-Werror", "-fsyntax-only",
                    f"-I{REPO / 'client_lib' / 'c' / 'include'}", str(source)],
                   check=True, capture_output=True, timeout=60)


def test_the_csharp_snippet_compiles(tmp_path):
    if shutil.which("mcs") is None:
        pytest.skip("mcs (mono-mcs) is not installed")
    source = tmp_path / "Snippet.cs"
    source.write_text(snippet("csharp"))
    subprocess.run(["mcs", "-target:library", f"-out:{tmp_path / 'Snippet.dll'}", str(source)],
                   check=True, capture_output=True, timeout=120)
