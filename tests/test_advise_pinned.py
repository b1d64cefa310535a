"""advise's rankings and counts are pinned: the costing caches (docs/performance.md) must
give the very numbers of the version before them (tests/data/advise_pinned.json, written on
main @7a746f6 by tests/data/make_advise_pinned.py), bit for bit."""

import json
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
PINNED = json.loads((DATA / "advise_pinned.json").read_text())
sys.path.insert(0, str(DATA))
from make_advise_pinned import CASES, run  # noqa: E402  (the generator's own cases)


@pytest.mark.parametrize("name", sorted(CASES))
def test_advise_reproduces_the_pinned_search(name):
    """Each case in turn in one process: the second runs with the caches warm from the
    first's cluster (other keys), as a session of several searches would."""
    pinned = PINNED[name]
    assert pinned["args"] == CASES[name]
    got = run(CASES[name])
    want = pinned["result"]
    # the ranking first (the clearest failure), then every count, point and front entry
    assert got["top_labels"] == want["top_labels"]
    assert [c["tokens_per_s"] for c in got["candidates"]] == [
        c["tokens_per_s"] for c in want["candidates"]]
    assert {k: got[k] for k in ("screened", "pruned", "not_fitting", "fitting", "variants",
                                "evaluated", "refused", "replayed")} == {
        k: want[k] for k in ("screened", "pruned", "not_fitting", "fitting", "variants",
                             "evaluated", "refused", "replayed")}
    assert got == want
    assert len(want["points"]) == want["evaluated"] > 100   # a real search was pinned

