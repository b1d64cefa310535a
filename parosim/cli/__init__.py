"""The ``parosim`` command line: parse, call the core, print.

``main`` is the entry point (``parosim = "parosim.cli:main"``); ``python -m parosim.cli`` runs it
too. Other names of :mod:`.commands` are reachable here as when ``parosim.cli`` was one module.
"""

import importlib
import sys


def main(argv=None):
    """Run the command line (``argv`` without the program name); returns the exit code."""
    from .commands import main as _main  # deferred: keeps ``import parosim.cli`` cheap
    return _main(argv)


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(importlib.import_module(".commands", __name__), name)
