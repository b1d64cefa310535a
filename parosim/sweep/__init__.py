"""Parallel, resumable sweeps: map a pure ``point -> row`` function over a grid.

Names of :mod:`.runner` are also reachable here (``parosim.sweep.NAME``), as they
were when ``parosim.sweep`` was one module; they are imported on first use so
that importing a submodule stays cheap.
"""

from .. import forward_names

__getattr__ = forward_names(__name__, "runner")
