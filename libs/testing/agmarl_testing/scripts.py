"""The repository's scripts (``benchmarks/*.py``, ``tools/*.py``) imported by path, for their tests: they are
not in a package. A script's dataclasses look their module up in ``sys.modules``, so it is registered
there under ``name`` while it is used."""
from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType


def load_script(path: Path, name: str) -> ModuleType:
    """Execute the script at ``path`` as module ``name`` (registered in ``sys.modules``) and return it."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@contextmanager
def script_module(path: Path, name: str) -> Iterator[ModuleType]:
    """``load_script`` for the ``with`` block (e.g. a module-scoped fixture), unregistered after it."""
    try:
        yield load_script(path, name)
    finally:
        sys.modules.pop(name, None)
