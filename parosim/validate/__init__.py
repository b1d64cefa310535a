"""Validation harness: run the simulator's collectives and Plans on real torch.distributed
ranks (gloo on CPU, NCCL on GPUs), on an emulated cluster of network namespaces or a real one,
and compare simulated with measured times.

Modules: :mod:`.emulate` (namespaces, veths, bridge, tc), :mod:`.ring` (explicit ring steps),
:mod:`.worker` (one rank), :mod:`.executor` (launch and gather), :mod:`.calibrate` (fit α, β and
overheads), :mod:`.report` (comparison table and plot), :mod:`.cli` (``parosim validate``).
Submodules are imported on use: rank processes import only torch.
"""
