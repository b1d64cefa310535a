"""One training step of one configuration, end to end: plan -> evaluate -> metrics.

Names of :mod:`.step` (then of :mod:`.point`, the sweep points) are also reachable here
(``parosim.simulate.NAME``), as they were when ``parosim.simulate`` was one module; they are
imported on first use so that importing a submodule stays cheap.
"""

from .. import forward_names

__getattr__ = forward_names(__name__, "step", "point")
