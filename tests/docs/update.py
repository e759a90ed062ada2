"""Rewrite the pages' quoted outputs, figures and generated tables from the current code:
``.venv/bin/python -m tests.docs.update [PAGE ...]`` (default: the README and every page under
docs/), from the repository root. What only an edit by hand can fix is listed, exit status 1."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .check import Context, check_page
from .markers import pages, rel
from .run import Server


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=".venv/bin/python -m tests.docs.update", description=__doc__)
    ap.add_argument("pages", nargs="*", type=Path, help="pages to rewrite (default: all)")
    ap.add_argument("--check", action="store_true", help="only report, write nothing")
    args = ap.parse_args(argv)
    targets = [p.resolve() for p in args.pages] or pages()
    ctx = Context(Server())
    manual = []
    try:
        for path in targets:
            rep = check_page(path, ctx)
            changed = rep.text != path.read_text(encoding="utf-8")
            if changed and not args.check:
                path.write_text(rep.text, encoding="utf-8")
            for p in rep.problems:
                print(("  " if p in rep.manual or args.check else "  fixed: ") + p)
            if changed or rep.problems:
                print(f"{rel(path)}: "
                      + ("rewritten" if changed and not args.check else "checked"))
            manual += rep.manual
    finally:
        ctx.close()
    if manual:
        print(f"\n{len(manual)} problem(s) need an edit by hand (above, without 'fixed:')",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
