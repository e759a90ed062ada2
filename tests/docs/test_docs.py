"""Every page's examples, quoted outputs and figures agree with the code (tests/docs/__init__.py
says how pages mark them). A failure names the page, the line, the example and the figure
that differs; ``.venv/bin/python -m tests.docs.update`` rewrites what the code determines."""

from __future__ import annotations

import pytest

from .check import UPDATE, Context, check_page
from .figures import FIGURES
from .markers import ROOT, pages, read, rel
from .run import Server

README_MAX_LINES = 200


@pytest.fixture(scope="module")
def ctx():
    ctx = Context(Server())      # the server started by the first page that needs it
    yield ctx
    ctx.close()


@pytest.mark.parametrize("path", pages(), ids=rel)
def test_page_agrees_with_the_code(path, ctx):
    rep = check_page(path, ctx)
    if rep.problems:
        fix = (f"\nrun `{UPDATE} {rep.page}` to rewrite the figures and outputs from the code"
               if len(rep.manual) < len(rep.problems) else "")
        pytest.fail(f"{len(rep.problems)} difference(s):\n  " + "\n  ".join(rep.problems)
                    + fix, pytrace=False)


def test_the_pages_run_examples():
    """The checks above are not vacuous: pages carry examples, outputs and figures."""
    marks = [b.mark for p in pages() for b in read(p).blocks]
    assert marks.count("example") >= 4 and marks.count("output") >= 2
    assert marks.count("illustrative") >= 8
    used = {n for p in pages() for n, _, _ in read(p).figures()} | {
        g.name for p in pages() for g in read(p).gens}
    assert len(used) >= 15
    assert set(FIGURES) == used, f"figures no page quotes: {sorted(set(FIGURES) - used)}"


def test_readme_stays_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines < README_MAX_LINES, f"README.md has {lines} lines (keep it under 200)"
