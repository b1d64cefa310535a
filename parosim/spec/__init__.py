"""Frozen inputs: the system (GPU, links, NICs, collective tuning), the model, the training
configuration, the PaRO strategy and the framework runtime profile.
"""
