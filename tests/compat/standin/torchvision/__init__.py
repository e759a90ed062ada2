"""Stand-in for ``torchvision`` in the SGLang benchmark client's environment only (built by
tests/compat/build_clients.sh; never installed in the project's own environment).

SGLang's multimodal modules import torchvision at import time; ``sglang.bench_serving`` never
calls it, and PyPI has no torchvision build that loads with the CPU torch wheel there. Every
``torchvision.*`` module resolves to a stand-in whose attributes are placeholders: importing
works, calling anything raises.
"""

import importlib.abc
import importlib.machinery
import sys
import types


class _Absent:
    def __init__(self, name):
        self._name = name

    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Absent(f"{self._name}.{item}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name}: torchvision is not installed (stand-in module)")

    def __mro_entries__(self, bases):
        return (object,)


class _Module(types.ModuleType):
    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Absent(f"{self.__name__}.{item}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
__path__ = []
__version__ = "0.0.0+standin"


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Absent(f"torchvision.{name}")
