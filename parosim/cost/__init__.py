"""What one GPU spends: compute (kernels, FP8 casts) and memory (model states, activations,
buffers).
"""
