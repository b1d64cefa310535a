"""The JSON of the README's commands (small configurations) is what it was when the golden
files were made: a refactoring changes no number. Regenerate them only for a change of the
model that is meant to move results, and say which outputs moved in the commit."""

import json
import pathlib
import sys

import pytest

GOLDEN = pathlib.Path(__file__).resolve().parent / "data" / "golden"
sys.path.insert(0, str(GOLDEN))
import make_cli_golden  # noqa: E402

CASES = list(enumerate(make_cli_golden.commands()))
VOLATILE = {"wall_s"}     # the tool's own run time (advise reports it): not a result


def _strip(x):
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items() if k not in VOLATILE}
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return x


def test_golden_files_cover_every_command():
    assert len(CASES) >= 10
    assert sorted(GOLDEN.glob("*.json")) == [GOLDEN / f"{i:02d}.json" for i, _ in CASES]


@pytest.mark.parametrize("i,argv", CASES, ids=[" ".join(a[:3]) for _, a in CASES])
def test_json_identical_to_golden(i, argv, monkeypatch):
    monkeypatch.chdir(GOLDEN.parents[2])          # commands name files from the repository root
    want = _strip(json.loads((GOLDEN / f"{i:02d}.json").read_text()))
    got = _strip(json.loads(json.dumps(make_cli_golden.run(argv), sort_keys=True)))
    assert got == want
