"""``python -m parosim``: the same as the ``parosim`` command."""

import sys

from .cli import main

sys.exit(main())
