"""Import-only stand-in packages: a package that imports (any submodule path resolves) but whose
every attribute raises :class:`StandInCallError` naming the op when called.

Contract: ``install_finder(StandInFinder(root, reason, extras))`` makes ``root`` and every
``root.x.y`` importable as stand-ins (idempotent per root); ``extras(module)`` may add real
objects (e.g. an enum a caller reads at import time). ``real_package_works(name)`` says whether
the real package imports, so a stand-in is only ever installed where the real one cannot work.
Used by ``sglang_patch/cpu_compat.py`` for CUDA-only packages SGLang imports at module level.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any


class StandInCallError(NotImplementedError):
    """Raised when code calls into a stand-in package: that op has no CPU implementation here."""


class _StandInAttr:
    """An attribute of a stand-in package: resolves further attributes, raises when called."""

    def __init__(self, qualname: str, reason: str) -> None:
        self._qualname = qualname
        self._reason = reason

    def __getattr__(self, name: str) -> _StandInAttr:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _StandInAttr(f"{self._qualname}.{name}", self._reason)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise StandInCallError(
            f"{self._qualname} was called, but it is a CPU import-only stand-in "
            f"({self._reason}); this code path needs the real package"
        )

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        # Lets `class X(stub.Base)` import; instantiating X then raises like a call would.
        qualname, reason = self._qualname, self._reason

        def _init(self: Any, *a: Any, **k: Any) -> None:
            _StandInAttr(qualname, reason)()

        return (type(qualname.rsplit(".", 1)[-1], (), {"__init__": _init}),)

    def __repr__(self) -> str:
        return f"<stand-in {self._qualname}>"


class _StandInModule(ModuleType):
    _stand_in_reason = ""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _StandInAttr(f"{self.__name__}.{name}", self._stand_in_reason)


class StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``root`` and every ``root.sub.module`` as a stand-in package."""

    def __init__(self, root: str, reason: str, extras: Callable[[ModuleType], None]) -> None:
        self.root = root
        self.reason = reason
        self.extras = extras

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.root and not fullname.startswith(self.root + "."):
            return None
        spec = importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        spec.submodule_search_locations = []
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = _StandInModule(spec.name)
        module._stand_in_reason = self.reason
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__doc__ = f"CPU import-only stand-in: {self.reason}"
        module.__version__ = "0.0.0+cpu.stand.in"  # type: ignore[attr-defined]
        self.extras(module)


def install_finder(finder: StandInFinder) -> None:
    if not any(isinstance(f, StandInFinder) and f.root == finder.root for f in sys.meta_path):
        sys.meta_path.insert(0, finder)


def real_package_works(name: str) -> bool:
    """True when ``name`` is installed and imports; a broken partial import is cleaned up."""
    if name in sys.modules:
        return not isinstance(sys.modules[name], _StandInModule)
    try:
        if importlib.util.find_spec(name) is None:
            return False
        importlib.import_module(name)
        return True
    except Exception:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]
        return False
