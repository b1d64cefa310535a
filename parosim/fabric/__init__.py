"""The cluster as a network: graph builders, topology, the symmetry proof, the flow-level
network (max-min sharing) and the simpy engine.
"""
