"""``python -m parosim.sweep SPEC --out DIR ...``: the same as ``parosim sweep``."""

import sys

from ..cli import main

sys.exit(main(["sweep", *sys.argv[1:]]))
