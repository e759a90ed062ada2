"""The source tree's shape: no import circles between files, and no file over 500 lines.

Import circles: the graph of every import between the namespace's modules (grimp, as
``lint-imports`` builds it: module level, inside functions and under ``if TYPE_CHECKING:``; a
package's ``__init__`` is a module like any other) has no strongly connected component of more
than one module. A failure names each circle's modules and the imports that close it.

Length: no ``.py`` file under model/, service/, calibration/, sim/ or cli/ has more than
``MAX_LINES`` lines; a longer one is split by responsibility, each part a module that can be
named in one phrase.
"""

from __future__ import annotations

from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("model", "service", "calibration", "sim", "cli")
PACKAGES = tuple(f"engine_advisor.{f}" for f in FOLDERS)
MAX_LINES = 500


def strongly_connected(graph: grimp.ImportGraph) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph``'s modules (iterative: no recursion
    limit), each sorted, in a stable order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        while work:
            v, successors = work[-1]
            for w in successors:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w)))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    components.append(sorted(component))
    return sorted(components)


def describe(graph: grimp.ImportGraph, circle: list[str]) -> str:
    """The circle's modules and each import between two of them (file line: the import)."""
    members = set(circle)
    lines = [" <-> ".join(circle)]
    for importer in circle:
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & members):
            for d in graph.get_import_details(importer=importer, imported=imported):
                lines.append(f"    {importer}:{d['line_number']} imports {imported}: "
                             f"{d['line_contents']}")
    return "\n".join(lines)


def test_no_file_level_import_circles():
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=False, cache_dir=None)
    circles = [c for c in strongly_connected(graph) if len(c) > 1]
    assert not circles, (f"{len(circles)} import circle(s) between files (each import below, "
                         "TYPE_CHECKING and function-level ones included):\n"
                         + "\n".join(describe(graph, c) for c in circles))


def test_the_circle_finder_finds_circles():
    """The check above can fail: a graph with a circle of three and one of two."""
    graph = grimp.ImportGraph()
    for m in ("p", "p.a", "p.b", "p.c", "p.d", "p.e", "p.f"):
        graph.add_module(m)
    for importer, imported in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.d", "p.a"),
                               ("p.e", "p.f"), ("p.f", "p.e")):
        graph.add_import(importer=importer, imported=imported, line_number=1,
                         line_contents=f"import {imported}")
    circles = [c for c in strongly_connected(graph) if len(c) > 1]
    assert circles == [["p.a", "p.b", "p.c"], ["p.e", "p.f"]]
    assert "p.c:1 imports p.a: import p.a" in describe(graph, circles[0])


def test_no_source_file_over_the_line_limit():
    long = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            n = len(path.read_text(encoding="utf-8").splitlines())
            if n > MAX_LINES:
                long.append(f"{path.relative_to(ROOT)}: {n} lines")
    assert not long, (f"source files over {MAX_LINES} lines (split each by responsibility):\n"
                      + "\n".join(long))
