"""numba's on-disk cache of the formulas, invalidated by a change to any file of this package.

numba stamps a function's cache with its own source file only. A formula compiled with another
module's formula inlined or linked into it (``decode_into`` with ``read_s``, ``rows_into`` with
``memory_fit`` and ``decode_into``, ...) would load stale machine code after only the other file
changed. ``PackageLocator`` gives each function of this package the cache numba's own locators
give it (``NUMBA_CACHE_DIR``, else the user's cache folder, ``~/.cache/numba``) with a stamp of
every ``.py`` file of the package as well: an edit to any of them recompiles them all. It never
caches in ``__pycache__`` beside the module, as numba would where that is writable: files the
install does not own, left behind in ``site-packages/engine_advisor/...`` by an uninstall, would
make those folders namespace packages that shadow a later editable install's. ``register``
puts it first among numba's locators; the package's ``__init__`` calls it, so it runs before
any of the modules compiles. (``NUMBA_CACHE_LOCATOR_CLASSES``, which replaces numba's list,
leaves it out.)

The locators are numba's internals: where a release lacks them, ``register`` does nothing and
numba's own per-file stamp applies. That can only go stale while the package's files are
edited in place (an install writes every file anew), so it matters to developers, not users.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

from numba.core import caching

PACKAGE = Path(__file__).resolve().parent
# numba's base of the cache implementations, whose class list of locators each function's cache
# tries in turn (``_CacheImpl`` in older releases), and the locators' base class
IMPL = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
_CacheLocator = getattr(caching, "_CacheLocator", object)
# the locator that caches in __pycache__ beside the source (``_InTreeCacheLocator`` in older
# releases): skipped
IN_TREE = getattr(caching, "InTreeCacheLocator", None) or getattr(caching, "_InTreeCacheLocator",
                                                                   None)


def package_stamp(folder: Path = PACKAGE) -> str:
    """A digest of the names and contents of every ``.py`` file in ``folder`` (re-read when a
    file's size or modification time changes)."""
    stats = []
    for path in sorted(folder.glob("*.py")):
        st = path.stat()
        stats.append((path.name, st.st_mtime_ns, st.st_size))
    return _digest(folder, tuple(stats))


@cache
def _digest(folder: Path, stats: tuple[tuple[str, int, int], ...]) -> str:
    h = hashlib.sha256()
    for name, _, _ in stats:
        h.update(name.encode() + b"\0")
        h.update((folder / name).read_bytes() + b"\0")
    return h.hexdigest()


class PackageLocator(_CacheLocator):
    """The locator numba would use for a function of this package, its source stamp the
    package's as well as the function's file's."""

    def __init__(self, inner: _CacheLocator):
        self._inner = inner

    def ensure_cache_path(self) -> None:
        self._inner.ensure_cache_path()

    def get_cache_path(self) -> str:
        return self._inner.get_cache_path()

    def get_source_stamp(self) -> object:
        return (self._inner.get_source_stamp(), package_stamp())

    def get_disambiguator(self) -> str:
        return self._inner.get_disambiguator()

    @classmethod
    def from_function(cls, py_func, py_file):
        if Path(py_file).resolve().parent != PACKAGE:
            return None
        for other in IMPL._locator_classes:
            if other is not cls and other is not IN_TREE:
                inner = other.from_function(py_func, py_file)
                if inner is not None:
                    return cls(inner)
        return None


def register() -> None:
    """Put ``PackageLocator`` first among the locators numba tries (once); nothing where this
    numba release has no such list."""
    if IMPL is None or _CacheLocator is object or not hasattr(IMPL, "_locator_classes"):
        return
    if PackageLocator not in IMPL._locator_classes:
        IMPL._locator_classes.insert(0, PackageLocator)
