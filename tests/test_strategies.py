"""Strategies: the 14 valid PaRO strategies, the 13 invalid ones, parsing, model-state bytes."""

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parosim.errors import InputError
from parosim.spec.strategy import (
    ALL_STRATEGIES,
    INVALID_COMBINATIONS,
    KNOWN_SYSTEMS,
    Level,
    Strategy,
    model_states_bytes,
    parse_strategy,
)

PAPER_ORDER = "NNN NNI NII INI III NNG NIG NGG ING IIG IGG GNG GIG GGG".split()
ORDER = {"N": 0, "I": 1, "G": 2}


def test_fourteen_in_paper_order():
    assert [s.short for s in ALL_STRATEGIES] == PAPER_ORDER
    assert [s.name for s in ALL_STRATEGIES] == [f"PaRO-{x}" for x in PAPER_ORDER]


def test_valid_iff_os_at_least_as_fine():
    valid = {"".join(c) for c in itertools.product("NIG", repeat=3)
             if ORDER[c[2]] >= max(ORDER[c[0]], ORDER[c[1]])}
    assert valid == set(PAPER_ORDER)
    assert len(INVALID_COMBINATIONS) == 13
    assert set(INVALID_COMBINATIONS) == {"".join(c) for c in itertools.product("NIG", repeat=3)
                                         } - valid


@pytest.mark.parametrize("combo", INVALID_COMBINATIONS)
def test_invalid_rejected_with_reason(combo):
    for text in (combo, f"PaRO-{combo}", f"paro-{combo.lower()}"):
        with pytest.raises(InputError) as e:
            parse_strategy(text)
        msg = str(e.value)
        assert f"PaRO-{combo} is invalid" in msg
        assert f"optimizer states ({combo[2]})" in msg and "at least as finely" in msg
    with pytest.raises(InputError, match="invalid"):
        Strategy(*(Level(c) for c in combo))


def test_invalid_suggests_nearest_valid():
    with pytest.raises(InputError, match="did you mean PaRO-GNG"):
        parse_strategy("GNN")


@pytest.mark.parametrize("text, short", [
    ("NIG", "NIG"), ("PaRO-NIG", "NIG"), ("paro-nig", "NIG"), ("paro_iig", "IIG"),
    (" ggg ", "GGG"), ("ddp", "NNN"), ("DDP", "NNN"), ("zero1", "NNG"), ("ZeRO-1", "NNG"),
    ("zero2", "NGG"), ("zero3", "GGG"), ("fsdp", "GGG"), ("mics", "III"), ("hsdp", "III"),
    ("zeropp", "IGG"), ("ZeRO++", "IGG"), ("hpz", "IGG"),
])
def test_parse_forms(text, short):
    assert parse_strategy(text).short == short


@pytest.mark.parametrize("text", ["", "NI", "NIGG", "XYZ", "zero", "paro", "PaRO-"])
def test_garbage_lists_accepted_forms(text):
    with pytest.raises(InputError) as e:
        parse_strategy(text)
    msg = str(e.value)
    assert "PaRO-NIG" in msg and "zero3" in msg and "GGG" in msg


def test_levels_ordered_and_divisors():
    assert Level.N < Level.I < Level.G and max(Level.I, Level.N) is Level.I
    assert [lv.divisor(32, 8) for lv in Level] == [1, 8, 32]


def test_known_systems():
    assert {k: parse_strategy(k).system for k in KNOWN_SYSTEMS} == KNOWN_SYSTEMS
    assert parse_strategy("zero3").system.startswith("ZeRO-3")
    assert parse_strategy("NIG").system == ""


@pytest.mark.parametrize("strategy", ALL_STRATEGIES, ids=lambda s: s.short)
@pytest.mark.parametrize("n, m", [(32, 8), (128, 8), (16, 16), (8, 1)])
def test_model_states_formula_exact(strategy, n, m):
    psi, psi_t = 6_738_415_616, 6_738_415_616 * 3 / 1000
    d = {"N": 1, "I": m, "G": n}
    p, g, os = strategy.short
    expect = 2 * psi / d[p] + 2 * psi_t / d[g] + 12 * psi_t / d[os]
    assert model_states_bytes(strategy, psi, psi_t, n, m) == expect


def test_model_states_known_values():
    psi = 1e9
    assert model_states_bytes(parse_strategy("NNN"), psi, psi, 32, 8) == 16e9
    assert model_states_bytes(parse_strategy("GGG"), psi, psi, 32, 8) == 16e9 / 32
    assert model_states_bytes(parse_strategy("NNG"), psi, psi, 32, 8) == 4e9 + 12e9 / 32


def test_model_states_rejects_bad_group():
    with pytest.raises(InputError, match="m dividing n"):
        model_states_bytes(parse_strategy("III"), 1e9, 1e9, 12, 8)


@given(st.sampled_from(ALL_STRATEGIES), st.integers(1, 6), st.integers(1, 4),
       st.floats(1e-3, 1.0))
def test_finer_partition_never_costs_more_memory(strategy, groups, m_exp, r):
    # Moving any level one step finer (keeping validity) never increases model states.
    m = 2 ** m_exp
    n = m * groups
    base = model_states_bytes(strategy, 1e9, 1e9 * r, n, m)
    for field in ("p", "g", "os"):
        lv = getattr(strategy, field)
        if lv is Level.G:
            continue
        finer = {**{"p": strategy.p, "g": strategy.g, "os": strategy.os},
                 field: Level("NIG"[lv.rank + 1])}
        try:
            s2 = Strategy(**finer)
        except InputError:
            continue
        assert model_states_bytes(s2, 1e9, 1e9 * r, n, m) <= base
