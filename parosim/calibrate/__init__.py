"""Fits to measurements: link and protocol parameters from collective times
(:mod:`.links`), compute efficiency from step times (:mod:`.steps`).

Names of :mod:`.links` are also reachable here (``parosim.calibrate.NAME``), as they
were when ``parosim.calibrate`` was one module; they are imported on first use so
that importing a submodule stays cheap.
"""

import importlib


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(importlib.import_module(".links", __name__), name)
