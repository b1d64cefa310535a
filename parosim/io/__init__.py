"""The only code that reads or writes files: YAML specs in, JSON / CSV / traces out.

Submodules: :mod:`.yamlspec` (shared YAML helpers), :mod:`.cluster` (cluster presets and
YAML), :mod:`.model` (model presets and YAML), :mod:`.trace` (Chrome-trace JSON),
:mod:`.sweep` (sweep specs, results CSV).
"""

from .cluster import available_presets, cluster_to_yaml, load_cluster, topologies_dir
from .model import load_model

__all__ = ["available_presets", "cluster_to_yaml", "load_cluster", "load_model",
           "topologies_dir"]
