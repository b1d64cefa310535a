"""Collection rules for the whole repository (tests/ and the doctests of parosim/).

Without torch (it comes with the ``validate`` extra, ``pip install -e ".[validate]"``), the
modules that import it at the top are not collected for doctests: the rest of the suite runs
and the validation tests skip themselves.
"""

import importlib.util

collect_ignore = []
if importlib.util.find_spec("torch") is None:
    collect_ignore += ["parosim/validate/worker.py", "parosim/validate/ring.py"]
