"""The house's dependency graphs have no circles, and the collector never imports the inference role.

Python: every ``import`` of an ``rlinkd.`` module counts (top level, inside functions, under
``TYPE_CHECKING``): a circle that only type checking sees still ties two modules together.
C client: a source file depends on the one that defines an ``rlk_`` function it calls.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.helpers import REPO

PACKAGES = ("daemon", "shm", "client_lib")


def module_name(path: Path) -> str:
    """``daemon/collector/server.py`` -> ``rlinkd.daemon.collector.server``."""
    parts = path.relative_to(REPO).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("rlinkd", *parts))


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The ``rlinkd`` modules ``path`` imports, anywhere in the file (``from pkg import mod``
    names the module ``pkg.mod`` when that is one; otherwise ``pkg``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            subs = {f"{node.module}.{a.name}" for a in node.names} & known
            found |= subs or {node.module}
    return found & known


def python_graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))]
    known = {module_name(p) for p in files}
    return {module_name(p): imports_of(p, known) - {module_name(p)} for p in files}


_DEFINES = re.compile(r"^[A-Za-z][^;(]*\b(rlk_\w+)\s*\([^;]*$", re.M)
_CALLS = re.compile(r"\b(rlk_\w+)\s*\(")


def c_client_graph() -> dict[str, set[str]]:
    """Source file -> the source files defining the ``rlk_`` functions it calls."""
    sources = sorted((REPO / "client_lib" / "c" / "src").glob("*.c"))
    texts = {p.name: p.read_text() for p in sources}
    owner = {name: f for f, text in texts.items() for name in _DEFINES.findall(text)}
    return {f: {owner[n] for n in _CALLS.findall(text) if n in owner} - {f} for f, text in texts.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycles_finds_a_circle_and_passes_a_tree():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_python_import_circles():
    assert cycles(python_graph()) == []


def test_the_collector_does_not_import_the_inference_role():
    graph = python_graph()
    wrong = sorted((m, d) for m, deps in graph.items() if m.startswith("rlinkd.daemon.collector")
                   for d in deps if d.startswith("rlinkd.daemon.inference"))
    assert wrong == [], "serving code both roles use belongs in rlinkd.daemon.serving"


def test_import_direction_daemon_client_lib_shm():
    graph = python_graph()
    wrong = sorted((m, d) for m, deps in graph.items() for d in deps
                   if (m.startswith("rlinkd.shm") and not d.startswith("rlinkd.shm"))
                   or (m.startswith("rlinkd.client_lib") and d.startswith("rlinkd.daemon")))
    assert wrong == []


def test_the_c_client_graph_sees_calls_and_has_no_circles():
    graph = c_client_graph()
    assert "rlk_json.c" in graph["rlk_proto.c"]  # the parser sees a known call
    assert cycles(graph) == []
