"""The fast paths of the closed form give the same doubles as the reference code.

``ring_phase_costs`` (every chunk count at once) against one ``make_phase`` per size,
``best_chunks`` against the reference search, and the numpy ring profile against the loop.
"""

import itertools
from dataclasses import replace

import numpy as np
import pytest

from parosim.collectives.cost import latency_part, phase_time, ring_profile
from parosim.collectives.lowering import (
    _best_chunks,
    _best_chunks_loop,
    lower,
    scope_rings,
)
from parosim.collectives.nccl import make_phase, ring_phase_costs
from parosim.collectives.types import Op, RingSet, Scope
from parosim.io import load_cluster
from parosim.plan.layout import layout_for
from parosim.spec.collective import RING_ALGOS, RING_OPS


def _clusters():
    out = []
    for name in ("paper-a100-roce", "dgx-a100-ib", "dgx-h100-ib", "aws-p4de"):
        for nodes, gn in ((4, 1), (8, 2)):
            out.append(load_cluster(name, nodes=nodes).with_group_nodes(gn))
    base = load_cluster("dgx-a100-ib", nodes=8).with_group_nodes(2)
    tun = base.collective
    out += [replace(base, collective=replace(tun, model="ideal")),
            replace(base, collective=replace(tun, reduction_overlap=False)),
            replace(base, collective=replace(tun, reduction_hbm_factor=0.0)),
            replace(base, collective=replace(tun, serial_progress=True)),
            replace(base, collective=replace(tun, protocols=("simple", "ll")))]
    # the NCCL 2.8 tuner profile (its plateau and LL hop rules) on the ABCI preset
    out += [load_cluster("abci-a100", nodes=nodes).with_group_nodes(gn)
            for nodes, gn in ((4, 1), (8, 2))]
    return out


CLUSTERS = _clusters()
SIZES = (1.0, 4096.0, 3e5, 2.0**24, 7.7e8, 2.0**33)


@pytest.mark.parametrize("ci", range(len(CLUSTERS)))
def test_ring_phase_costs_equal_make_phase(ci):
    spec = CLUSTERS[ci]
    sets = [scope_rings(spec, s) for s in Scope]
    for rs, op in itertools.product(sets, RING_OPS):
        totals = np.array(SIZES) / np.arange(1, len(SIZES) + 1)
        t, lat = ring_phase_costs(spec, op, rs, totals)
        for i, total in enumerate(totals.tolist()):
            ph = make_phase(spec, "", op, rs, total, "x")
            assert t[i] == phase_time(spec, ph) and lat[i] == latency_part(spec, ph)


@pytest.mark.parametrize("ci", range(len(CLUSTERS)))
def test_best_chunks_equals_reference_search(ci):
    spec = CLUSTERS[ci]
    if spec.groups == 1 or spec.group_size == 1:
        return
    cases = [(scope_rings(spec, Scope.INTRA), scope_rings(spec, Scope.INTER), spec.group_size)]
    try:
        gs = layout_for(spec, 2, 1).dp_scopes(0)
        cases.append((gs.intra, gs.inter, gs.m))
    except Exception:  # no TP 2 layout on this shape
        pass
    for (intra, inter, m), op, size in itertools.product(
            cases, (Op.ALL_GATHER, Op.REDUCE_SCATTER, Op.ALL_REDUCE), SIZES):
        assert _best_chunks(spec, op, size, intra, inter, m) == _best_chunks_loop(
            spec, op, size, intra, inter, m)


@pytest.mark.parametrize("ci", range(len(CLUSTERS)))
def test_ring_profile_arrays_equal_loop(ci):
    spec = CLUSTERS[ci]
    for algo, op, scope in itertools.product(RING_ALGOS, RING_OPS, list(Scope)):
        for ph in lower(spec, op, scope, 2.0**28, algo).phases:
            rs = ph.ringset
            if not isinstance(rs, RingSet) or rs.hop_arrays is None:
                continue
            loop = RingSet(rs.rings, rs.label)
            loop.__dict__["hop_arrays"] = None   # force the per-hop loop
            assert ring_profile.__wrapped__(spec, rs) == ring_profile.__wrapped__(spec, loop)


def test_advise_rankings_identical_with_the_reference_search(monkeypatch):
    """advise on a small case: the same ranking and figures with the reference HO-Ring
    chunk search and no cached costs."""
    from parosim.collectives import lowering
    from parosim.evaluate import threed
    from parosim.plan.layout import lower_group
    from parosim.spec.model import preset
    from parosim.studies.advise import advise

    def run():
        res = advise(preset("llama-7b"), load_cluster("dgx-h100-ib", 4), 128, seq_len=2048,
                     engine_top=0, max_micro_batch=2, top=8,
                     strategies=["NNN", "NGG", "IIG", "GGG"])
        res.pop("wall_s")
        return res

    fast_search, calls = lowering._best_chunks, []

    def counted(*a):
        calls.append(fast_search(*a))
        return calls[-1]

    monkeypatch.setattr(lowering, "_best_chunks", counted)
    monkeypatch.setattr(threed, "_SUMMARY_TIMES", {})
    lower_group.cache_clear()
    fast = run()
    assert len(calls) > 10 and max(calls) > 1   # HO-Ring candidates were costed
    monkeypatch.setattr(lowering, "_best_chunks", lowering._best_chunks_loop)
    monkeypatch.setattr(threed, "_SUMMARY_TIMES", {})
    lower_group.cache_clear()
    assert run() == fast
    lower_group.cache_clear()


def test_a_ring_set_with_other_hops_keeps_the_loop():
    """A pair set (its hops are its pairs, not rings) has no ring arrays: its profile is the
    loop's."""
    from parosim.plan.layout import PairSet

    pairs = PairSet(((0, 8), (8, 0), (1, 9), (9, 1)), "pairs")
    assert pairs.hop_arrays is None
    spec = load_cluster("dgx-a100-ib", nodes=2)
    _, _, frac = ring_profile.__wrapped__(spec, pairs)
    assert frac == 1.0
