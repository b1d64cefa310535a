"""Figures (matplotlib lives here, at the edge): sweep results, heterogeneous runs, advise.

Names of :mod:`.figures` are also reachable here (``parosim.plots.NAME``), as they
were when ``parosim.plots`` was one module; they are imported on first use so
that importing a submodule stays cheap.
"""

import importlib


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(importlib.import_module(".figures", __name__), name)
