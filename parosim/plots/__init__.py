"""Figures (matplotlib lives here, at the edge): sweep results, heterogeneous runs, advise.

Names of :mod:`.figures` are also reachable here (``parosim.plots.NAME``), as they
were when ``parosim.plots`` was one module; they are imported on first use so
that importing a submodule stays cheap.
"""

from .. import forward_names

__getattr__ = forward_names(__name__, "figures")
