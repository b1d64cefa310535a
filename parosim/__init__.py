"""parosim: a discrete-event simulator of data-parallel LLM training with PaRO strategies.

See README.md. The core (specs, topology, network, collectives, strategies, plan, engine,
metrics) imports no pandas, matplotlib or torch; those live at the edges (io, plots, sweep,
validate, cli).
"""

__version__ = "0.1.0"
