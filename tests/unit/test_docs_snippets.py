"""The documentation's Python and TOML samples stay valid: every ```python block of README.md and
docs/*.md compiles, every ```toml block loads as an rlinkd config (C, C++ and C# samples:
test_readme.py and test_c_snippets.py)."""
from __future__ import annotations

import re

import pytest

from rlinkd.daemon.config import load_config
from tests.helpers import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def blocks(language: str) -> list[tuple[str, str]]:
    return [(f"{page.relative_to(REPO)}#{i}", text) for page in PAGES
            for i, text in enumerate(re.findall(rf"```{language}\n(.*?)```", page.read_text(encoding="utf-8"),
                                                flags=re.S))]


@pytest.mark.parametrize(("where", "source"), blocks("python"), ids=lambda v: v if "#" in v else "")
def test_the_python_sample_compiles(where, source):
    compile(source, where, "exec")


@pytest.mark.parametrize(("where", "text"), blocks("toml"), ids=lambda v: v if "#" in v else "")
def test_the_toml_sample_is_a_valid_config(where, text, tmp_path):
    path = tmp_path / "sample.toml"
    path.write_text(text)
    load_config(path, resolve_dirs=False)


def test_the_samples_are_found():
    assert len(blocks("python")) >= 5 and len(blocks("toml")) >= 2
