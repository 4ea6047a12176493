"""docs/serving.md's drawing of a request's path names files that exist, and every stage of
the serving turn (daemon/inference/turn.py) is drawn."""
from __future__ import annotations

import re

from tests.helpers import REPO

SOURCES = [p.relative_to(REPO).as_posix() for top in ("daemon", "shm", "client_lib")
           for p in (REPO / top).rglob("*") if p.suffix in (".py", ".c")]


def drawing() -> str:
    page = (REPO / "docs" / "serving.md").read_text(encoding="utf-8")
    section = page.split("## One request's path", 1)[1]
    return re.findall(r"```text\n(.*?)```", section, flags=re.S)[0]


def test_every_file_the_drawing_names_exists():
    named = set(re.findall(r"[\w/]+\.(?:py|c)\b", drawing()))
    assert len(named) >= 15
    missing = [n for n in named if not any(s == n or s.endswith("/" + n) for s in SOURCES)]
    assert not missing


def test_every_stage_of_the_turn_is_drawn():
    text = drawing()
    for stage in ("scan", "gather", "admit", "route", "order", "execute", "publish"):
        assert re.search(rf"^\s+{stage}\s", text, flags=re.M), stage
