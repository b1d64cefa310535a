"""The ``parosim`` command line: parse, call the core, print.

``main`` is the entry point (``parosim = "parosim.cli:main"``); ``python -m parosim.cli`` runs it
too. Other names of :mod:`.commands` are reachable here as when ``parosim.cli`` was one module.
"""

import gc
import os
import sys

from .. import forward_names


def main(argv=None):
    """Run the command line (``argv`` without the program name); returns the exit code."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args == ["--version"]:    # fast path: no parser, no command module
        from .. import __version__  # deferred: the package is already imported

        print(f"parosim {__version__}")
        return 0
    if next((x for x in args if not x.startswith("-")), None) not in ("calibrate", "validate"):
        # numpy's OpenBLAS starts one thread per core when imported; the simulator's linear
        # algebra is a few tiny fits (calibrate's, left as they are, and validate's torch are
        # not touched): one thread saves start-up CPU time. A value the user set is kept.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from .commands import main as _main  # deferred: keeps ``import parosim.cli`` cheap
    code = _main(args)
    if argv is None:
        # This process's own command line: the interpreter exits next. The cyclic garbage
        # collector's passes over every object left (tens of thousands: numpy's, simpy's,
        # parosim's) at exit cost more CPU than a collective's simulation; frozen objects are
        # skipped by them. Objects are still freed as their modules are cleared (files
        # flushed and closed); the output was flushed by the command already.
        gc.freeze()
    return code


__getattr__ = forward_names(__name__, "commands")
