"""argparse actions shared by the command modules (below :mod:`.parser`, which imports the
command modules that add their own flags)."""

from __future__ import annotations

import argparse


class Explicit(argparse.Action):
    """Stores the value and remembers that the flag was given (``_given_<dest>``): a flag
    that only applies with another can then be refused when given without it."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, f"_given_{self.dest}", True)
