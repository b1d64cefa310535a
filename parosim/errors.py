"""The one exception type users see.

Every bad input (unknown preset, malformed YAML, bad unit string, invalid strategy, ...) raises
:class:`InputError`, a :class:`ValueError` whose message names the value and what was expected.
The CLI turns it into one line on stderr and exit code 2; library users can catch it.
"""


class InputError(ValueError):
    """A user input was invalid. The message names the value and what was expected."""
