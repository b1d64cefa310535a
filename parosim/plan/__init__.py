"""The Plan of one global training step, and the rules that build it for every layout
(data-parallel, framework runtimes, TP x PP x CP).

Names of :mod:`.dataparallel` are also reachable here (``parosim.plan.NAME``), as they
were when ``parosim.plan`` was one module; they are imported on first use so
that importing a submodule stays cheap.
"""

import importlib


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(importlib.import_module(".dataparallel", __name__), name)
