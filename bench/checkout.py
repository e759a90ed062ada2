"""Run the code of a given checkout of this project, whatever the venv has installed.

The benchmarks compare two checkouts side by side in one run (``git worktree add DIR COMMIT``).
Since the import namespace (docs/develop.md), a checkout's folders are ``engine_advisor.model``
and so on only through an install's mapping; a bare ``PYTHONPATH=DIR`` no longer selects
them. ``import_path(DIR)`` makes a folder whose ``engine_advisor/`` links to DIR's folders: put
first on ``PYTHONPATH``, it wins over the venv's editable install (a namespace package is
looked up on the path before the install's finder). A checkout from before the namespace
imported its folders as top-level packages, from DIR itself; ``prefix(DIR)`` says which.

    PYTHONPATH=$(.venv/bin/python bench/checkout.py DIR) .venv/bin/python DIR/bench/bench_model.py
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path

FOLDERS = ("model", "service", "calibration", "sim", "cli")


def namespaced(checkout: Path) -> bool:
    """Whether ``checkout`` imports its folders as ``engine_advisor.<folder>``."""
    return '"engine_advisor.model" = "model"' in (checkout / "pyproject.toml").read_text()


def prefix(checkout: Path) -> str:
    """What goes before ``model.recommend`` in that checkout's import names."""
    return "engine_advisor." if namespaced(checkout) else ""


def import_path(checkout: Path) -> str:
    """A ``PYTHONPATH`` entry under which the import names are ``checkout``'s modules."""
    checkout = checkout.resolve()
    if not all((checkout / f).is_dir() for f in FOLDERS):
        raise SystemExit(f"{checkout}: not a checkout of engine-advisor")
    if not namespaced(checkout):
        return str(checkout)
    tag = hashlib.sha256(str(checkout).encode()).hexdigest()[:12]
    root = Path(tempfile.gettempdir()) / f"ea-checkout-{tag}"
    ns = root / "engine_advisor"
    ns.mkdir(parents=True, exist_ok=True)
    for f in FOLDERS:
        link = ns / f
        if not link.is_symlink():
            link.symlink_to(checkout / f, target_is_directory=True)
    return str(root)


def cli_module(checkout: Path) -> str:
    """The module ``python -m`` runs for that checkout's ``engine-advisor`` command."""
    return f"{prefix(checkout)}cli.main"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: checkout.py DIR   (prints the PYTHONPATH entry for DIR)")
    print(import_path(Path(sys.argv[1])))
