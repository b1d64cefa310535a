"""``python -m parosim.cli``: the same as the ``parosim`` command."""

import sys

from . import main

sys.exit(main())
