"""What ``kernels/__init__.py`` does when Python finds this folder as the top-level ``kernels``: the import name
of Hugging Face's kernel hub, a dependency of transformers, which imports it.

Python run from the repository root puts the root first on ``sys.path``, so a regular package here wins over the
installed distribution. Under that name the package hands the import to the next ``kernels`` on the path (the
distribution, which Python's import then returns from ``sys.modules``); with none installed it becomes an empty
module with no file and no version, which transformers reads as a PEP 420 folder on the path, not a package.
Written here because the folder must stay where the layout puts it and no import hook of the standard library
skips one path entry for one name.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from importlib.machinery import ModuleSpec, PathFinder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the folder that holds this package


def step_aside() -> None:
    """Put the other ``kernels`` (or an empty stand-in) in ``sys.modules`` in place of this package."""
    sys.modules.pop(__name__, None)  # this helper is no module of the distribution's
    elsewhere = [p for p in sys.path if os.path.abspath(p or os.curdir) != ROOT]
    spec = PathFinder.find_spec("kernels", elsewhere)
    if spec is None or spec.loader is None or spec.origin is None:
        empty = types.ModuleType("kernels")
        empty.__spec__ = ModuleSpec("kernels", None, is_package=True)
        empty.__path__ = []
        sys.modules["kernels"] = empty
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["kernels"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["kernels"]
        raise
