"""The identical-micro-step shortcut of the step replay (parosim.evaluate.periodic) gives the
full replay's result bit for bit, event count and hottest links included, and is taken
where the micro-steps repeat."""

import dataclasses

import pytest

from parosim.collectives.types import Algo
from parosim.evaluate import replay as rp
from parosim.fabric.folded import network_graph
from parosim.plan.dataparallel import build_plan
from parosim.simulate.step import with_overrides
from parosim.spec.model import preset
from parosim.spec.system import ClusterSpec
from parosim.spec.training import TrainingSpec

MODEL = preset("llama-7b")


def both(plan, cluster, algo=Algo.HO_RING, **kw):
    """The replay with the shortcut allowed and with it off."""
    fast = rp.replay(plan, cluster, algo, **kw)
    rp.PERIODIC[0] = False
    try:
        full = rp.replay(plan, cluster, algo, **kw)
    finally:
        rp.PERIODIC[0] = True
    return fast, full


def taken(plan, cluster, algo=Algo.HO_RING) -> bool:
    cache = rp.ProgramCache(cluster, algo)
    period = rp.plan_period(plan, cluster, cache)
    return rp.periodic_replay(plan, cluster, cache, period,
                              network_graph(cluster, period)) is not None


# GGG / IIG / III / NIG repeat from the second micro-step (NIG with a lane parked before
# the boundary's sync); the others are whatever they are: equal either way
@pytest.mark.parametrize("strategy,nodes,nic,accum", [
    ("GGG", 2, None, 6), ("IIG", 4, 25e9 / 8, 5), ("III", 2, None, 4), ("NIG", 2, None, 6),
    ("NNG", 2, 50e9 / 8, 6), ("IGG", 2, None, 6), ("NGG", 4, None, 5), ("ING", 2, None, 4),
])
def test_shortcut_equals_full_replay(strategy, nodes, nic, accum):
    cluster = with_overrides(ClusterSpec(nodes=nodes), nic)
    plan = build_plan(MODEL, strategy, cluster, TrainingSpec(accum_steps=accum))
    fast, full = both(plan, cluster)
    assert dataclasses.asdict(fast) == dataclasses.asdict(full)
    assert fast.events > 0 and fast.hot_links


@pytest.mark.parametrize("strategy", ["GGG", "IIG", "NIG"])
def test_shortcut_is_taken_where_micro_steps_repeat(strategy):
    cluster = ClusterSpec(nodes=2)
    plan = build_plan(MODEL, strategy, cluster, TrainingSpec(accum_steps=6))
    assert taken(plan, cluster)


def test_not_taken_below_four_micro_steps_or_with_trace():
    cluster = ClusterSpec(nodes=2)
    plan = build_plan(MODEL, "GGG", cluster, TrainingSpec(accum_steps=3))
    assert not taken(plan, cluster)
    plan = build_plan(MODEL, "GGG", cluster, TrainingSpec(accum_steps=5))
    fast, full = both(plan, cluster, trace=True)   # a trace replays in full
    assert dataclasses.asdict(fast) == dataclasses.asdict(full)
    assert len(fast.records) == len(plan.ops)


def test_overlap_slowdown_replays_in_full_and_equal():
    cluster = ClusterSpec(nodes=2)
    plan = build_plan(MODEL, "IIG", cluster, TrainingSpec(accum_steps=5))
    fast, full = both(plan, cluster, overlap_slowdown=1.2)
    assert dataclasses.asdict(fast) == dataclasses.asdict(full)
