"""The Plan of one global training step, and the rules that build it for every layout
(data-parallel, framework runtimes, TP x PP x CP).

Names of :mod:`.dataparallel` are also reachable here (``parosim.plan.NAME``), as they
were when ``parosim.plan`` was one module; they are imported on first use so
that importing a submodule stays cheap.
"""

from .. import forward_names

__getattr__ = forward_names(__name__, "dataparallel")
