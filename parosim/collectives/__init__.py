"""Collective algorithms: Ring, hierarchical (PaRO-CC) and HO-Ring.

``lower`` turns a collective into a Program of ring phases on lanes; ``closed_form_time``
gives its alpha-beta cost from the spec; ``simulate_collective`` runs it on the flow-level
network.
"""

from .cost import phase_time, program_time, ring_alpha_beta
from .lowering import lower, scope_rings, scope_size
from .simulate import (
                       CollectiveResult,
                       closed_form_time,
                       simulate_collective,
                       simulate_concurrent,
                       simulate_program,
)
from .types import Algo, Op, Phase, Program, RingSet, Scope, parse_enum

__all__ = ["Algo", "CollectiveResult", "Op", "Phase", "Program", "RingSet", "Scope",
           "closed_form_time", "lower", "parse_enum", "phase_time", "program_time",
           "ring_alpha_beta", "scope_rings", "scope_size", "simulate_collective",
           "simulate_concurrent", "simulate_program"]
