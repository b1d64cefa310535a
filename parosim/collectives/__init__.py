"""Collective algorithms: Ring, hierarchical (PaRO-CC), HO-Ring and NCCL's tuner (``nccl``).

``lower`` turns a collective into a Program of ring (or tree) phases on lanes;
``closed_form_time`` gives its cost from the spec; ``simulate_collective`` runs it on the
flow-level network. Names are imported on first use (PEP 562), so that code needing only the
closed form does not import simpy and numpy.
"""

from importlib import import_module

_WHERE = {
    "phase_time": "cost", "program_time": "cost", "ring_alpha_beta": "cost",
    "lower": "lowering", "scope_rings": "lowering", "scope_size": "lowering",
    "CollectiveResult": "simulate", "closed_form_time": "simulate",
    "simulate_collective": "simulate", "simulate_concurrent": "simulate",
    "simulate_program": "simulate",
    "Algo": "types", "Op": "types", "Phase": "types", "Program": "types", "RingSet": "types",
    "Scope": "types", "parse_enum": "types",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_WHERE))
