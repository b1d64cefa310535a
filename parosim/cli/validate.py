"""``parosim validate``: the torch.distributed harness (:mod:`parosim.validate.cli`).
"""

from __future__ import annotations

import argparse

from ..errors import InputError


def cmd_validate(a: argparse.Namespace) -> dict:
    try:
        import torch  # noqa: F401 - only `validate` needs it (the optional extra)
    except ImportError:
        raise InputError("parosim validate needs torch, which is not installed; install the "
                         "extra with: pip install -e \".[validate]\"") from None
    from ..validate.cli import run_validate  # deferred: loaded when the command runs (start-up)

    return run_validate(a)


def show_validate(res: dict) -> None:
    from ..validate.cli import format_table  # deferred: loaded when the command runs (start-up)

    print(format_table(res))
