"""Fits to measurements: link and protocol parameters from collective times
(:mod:`.links`), compute efficiency from step times (:mod:`.steps`).

Names of :mod:`.links` are also reachable here (``parosim.calibrate.NAME``), as they
were when ``parosim.calibrate`` was one module; they are imported on first use so
that importing a submodule stays cheap.
"""

from .. import forward_names

__getattr__ = forward_names(__name__, "links")
