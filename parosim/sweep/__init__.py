"""Parallel, resumable sweeps: map a pure ``point -> row`` function over a grid.

Names of :mod:`.runner` are also reachable here (``parosim.sweep.NAME``), as they
were when ``parosim.sweep`` was one module; they are imported on first use so
that importing a submodule stays cheap.
"""

import importlib


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(importlib.import_module(".runner", __name__), name)
