"""mkdocs hooks (mkdocs.yml ``hooks``): the site's home page is the repository's README.md and its
Benchmarks page is BENCHMARKS.md, read from the repository root at build time (each file stays where
GitHub and the other tools look for it, and is written once).

Contract: a relative link in those files is rewritten for the page's place in docs/ (``docs/X`` ->
``X``, ``BENCHMARKS.md`` -> ``benchmarks.md``); any other relative target that exists in the
repository (a plot under bench/results/; a Markdown file becomes a page outside the nav) is
copied into the site under its own path. A target that exists nowhere is left as written, so
the strict build fails on it as on any broken link.
"""
from __future__ import annotations

import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files, InclusionLevel

REPO = Path(__file__).resolve().parent.parent
# page in the site -> file at the repository root
ROOT_PAGES = {"index.md": "README.md", "benchmarks.md": "BENCHMARKS.md"}
ROOT_SOURCES = {source: page for page, source in ROOT_PAGES.items()}
LINK = re.compile(r"\]\((?!https?:|mailto:|#)([^)\s#]+)")


def rewrite_links(text: str) -> tuple[str, set[str]]:
    """``text`` with its ``docs/`` links made docs-relative, and the other relative targets it names."""
    others: set[str] = set()

    def one(match: re.Match[str]) -> str:
        target = match.group(1)
        if target.startswith("docs/"):
            return "](" + target.removeprefix("docs/")
        if target in ROOT_SOURCES:
            return "](" + ROOT_SOURCES[target]
        others.add(target)
        return match.group(0)

    return LINK.sub(one, text), others


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Adds the root pages and the repository files they link to."""
    for page, source in ROOT_PAGES.items():
        text, others = rewrite_links((REPO / source).read_text(encoding="utf-8"))
        files.append(File.generated(config, page, content=text))
        for target in sorted(others):
            path = REPO / target
            if path.is_file() and files.get_file_from_path(target) is None:
                inclusion = InclusionLevel.NOT_IN_NAV if target.endswith(".md") else InclusionLevel.UNDEFINED
                files.append(File.generated(config, target, abs_src_path=str(path), inclusion=inclusion))
    return files
