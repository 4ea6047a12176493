"""docs/configuration.md's table is exactly what ``rlinkd config --docs`` prints.

Fails (never skips) while docs/configuration.md is missing or out of date: regenerate the table with
``make docs-config`` (it writes what ``rlinkd config --docs`` prints into docs/configuration.md).
"""
from __future__ import annotations


from rlinkd.daemon.config import docs_markdown

from tests.helpers import REPO

README = REPO / "docs" / "configuration.md"


def test_readme_contains_the_generated_config_table():
    assert README.is_file(), f"{README} does not exist yet; it must contain the config table"
    text = README.read_text(encoding="utf-8")
    table = docs_markdown()
    assert table in text, ("docs/configuration.md does not contain the current config table verbatim; "
                           "run `make docs-config`")
