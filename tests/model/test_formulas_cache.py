"""numba's cache of the compiled formulas (engine_advisor.model.formulas.cache): every function of
the package is cached under a stamp of the whole package, so that a formula compiled with
another module's formula inlined into it recompiles when only that module changes."""

import importlib
import shutil
from pathlib import Path

import pytest
from numba.core.config import DISABLE_JIT
from numba.core.registry import CPUDispatcher

from engine_advisor.model.formulas import cache

MODULES = ("layout", "hardware", "memory", "terms", "rows", "predict", "evaluate")


@pytest.mark.skipif(DISABLE_JIT, reason="nothing is compiled with NUMBA_DISABLE_JIT=1")
def test_every_formula_is_cached_under_the_package_stamp():
    seen = 0
    for name in MODULES:
        module = importlib.import_module(f"engine_advisor.model.formulas.{name}")
        for obj in vars(module).values():
            if isinstance(obj, CPUDispatcher) and obj.__module__ == module.__name__:
                locator = obj._cache._impl.locator
                assert isinstance(locator, cache.PackageLocator), obj
                assert locator.get_source_stamp()[1] == cache.package_stamp()
                # never beside the source: an uninstall would leave the files, and their
                # folders would shadow a later editable install (tests/test_packaging.py)
                where = Path(locator.get_cache_path()).resolve()
                assert cache.PACKAGE not in (where, *where.parents), where
                seen += 1
    assert seen >= 14


def test_the_stamp_changes_with_any_file_of_the_package(tmp_path: Path):
    copy = tmp_path / "formulas"
    shutil.copytree(cache.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    stamp = cache.package_stamp(copy)
    assert stamp == cache.package_stamp(cache.PACKAGE)
    for name in MODULES:
        path = copy / f"{name}.py"
        text = path.read_text(encoding="utf-8")
        path.write_text(text + "\n", encoding="utf-8")
        assert cache.package_stamp(copy) != stamp, name
        path.write_text(text, encoding="utf-8")
        assert cache.package_stamp(copy) == stamp, name
