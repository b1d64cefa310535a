"""Shared fixtures. Nothing is mocked: tests run the real simpy engine, networkx routing,
torch.distributed and network namespaces where they are available."""

import os

import matplotlib

matplotlib.use("Agg")
os.environ.setdefault("MPLBACKEND", "Agg")
