"""The only code that reads or writes files: YAML specs in, JSON / CSV / traces out.

Submodules: :mod:`.yamlspec` (shared YAML helpers), :mod:`.cluster` (cluster presets and YAML).
"""

from .cluster import available_presets, cluster_to_yaml, load_cluster, topologies_dir

__all__ = ["available_presets", "cluster_to_yaml", "load_cluster", "topologies_dir"]
