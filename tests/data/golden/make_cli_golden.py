"""Write golden/<n>.json: the ``--json`` output of each line of commands.txt.

Run from the repository root of the version whose outputs are the reference:
``python tests/data/golden/make_cli_golden.py``. The outputs are this simulator's own
results (no published measurement), kept to show that a refactoring changes no number.
"""

import contextlib
import io
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent


def commands() -> list[list[str]]:
    lines = (HERE / "commands.txt").read_text().splitlines()
    return [ln.split() + ["--json"] for ln in lines if ln.strip() and not ln.startswith("#")]


def run(argv: list[str]) -> dict:
    from parosim.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
    return {"rc": rc, "result": json.loads(out.getvalue())}


if __name__ == "__main__":
    for i, argv in enumerate(commands()):
        res = run(argv)
        (HERE / f"{i:02d}.json").write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
        print(i, " ".join(argv), "rc", res["rc"], file=sys.stderr)
