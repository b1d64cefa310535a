"""The only code that reads or writes files: YAML specs in, JSON / CSV / traces out.

Submodules: :mod:`.yamlspec` (shared YAML helpers), :mod:`.cluster` (cluster presets and
YAML), :mod:`.model` (model presets and YAML), :mod:`.trace` (Chrome-trace JSON),
:mod:`.sweep` (sweep specs, results CSV).
"""

import importlib

# name -> submodule: loaded on first use, so reading a cluster does not import the model
# readers (start-up)
_WHERE = {"available_presets": "cluster", "cluster_to_yaml": "cluster", "load_cluster": "cluster",
          "topologies_dir": "cluster", "load_model": "model"}

__all__ = ["available_presets", "cluster_to_yaml", "load_cluster", "load_model",
           "topologies_dir"]


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
