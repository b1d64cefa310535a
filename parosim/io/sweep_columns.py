"""The columns of a sweep's ``results.csv``: every input key a spec may give and every
output, each with its meaning and unit (``columns.md`` of a sweep is made from these, and
docs/sweeps.md lists the same keys; a test compares them).
"""

from __future__ import annotations

# ---------------------------------------------------------------------------------------------
# Columns. Every column of results.csv, with its unit, in file order (inputs, then outputs).
# ---------------------------------------------------------------------------------------------

_ID_COLUMNS: dict[str, str] = {
    "point_id": "stable id of the point: first 16 hex digits of sha256 of its normalized "
                "JSON (sorted keys), the sha256 of every input file it references (cluster, "
                "model, runtime YAML / JSON; presets by their file) and the parosim version; "
                "the key used for resume",
}
_STEP_INPUTS: dict[str, str] = {
    "kind": "point kind: step",
    "mode": "engine (simpy flow-level replay) or analytic (closed-form alpha-beta)",
    "model": "model preset or YAML path (e.g. llama-7b)",
    "cluster": "cluster preset or YAML path (e.g. paper-a100-roce)",
    "nodes": "nodes in the cluster (count)",
    "group_nodes": "nodes per PaRO group (count; 1 = a group is a node)",
    "strategy": "PaRO strategy as given in the spec (e.g. NIG, PaRO-NIG, zero3)",
    "algo": "collective algorithm: ring, hierarchical or ho-ring",
    "trainable_ratio": "trainable fraction as given: full (1), partial (1/16), peft (3/1000) "
                       "or a number",
    "micro_batch": "sequences per GPU per micro-step (count)",
    "accum": "gradient-accumulation micro-steps per global step (count)",
    "seq_len": "tokens per sequence (count)",
    "nic_bandwidth": "override of the per-NIC bandwidth as given (e.g. 200Gbps); empty = "
                     "the preset's",
    "intra_bandwidth": "override of the per-GPU intra-node bandwidth as given; empty = the "
                       "preset's",
    "gpu_memory": "override of the GPU memory capacity as given (e.g. 40GB); empty = the "
                  "preset's",
    "recompute": "activation recomputation: True (full), False (none), auto, on, off, full, "
                 "none or selective as simulate --recompute; empty = auto (full only when "
                 "activations would not fit otherwise)",
    "runtime": "framework schedule: ideal, deepspeed, fsdp, paro or a runtime YAML path; "
               "empty = ideal (docs/runtimes.md)",
    "overlap_slowdown": "compute slowdown factor beside a collective (>= 1); empty = the "
                        "cluster's, else the runtime's default",
    "precision": "training precision: bf16 or fp8 (decoder-layer weight GEMMs at the GPU's "
                 "FP8 peak; docs/compute.md); empty = bf16",
}
# Optional step inputs: a column of results.csv only when the spec gives the key, so sweeps
# without them keep their columns. With the ones above, every option of ``parosim simulate``
# that shapes the step (its output options --trace, --plot, --link-timeline, --jobs, --json
# are not inputs).
# Optional for both kinds (docs/cluster-yaml.md, "Extending a preset"): a column only when the
# spec gives the key.
CLUSTER_SET_INPUT: dict[str, str] = {
    "cluster_set": "cluster-YAML keys changed for the point, as --set items separated by ';' "
                   "(e.g. nic.bandwidth=100Gbps; collective.model=ideal); empty = none",
}
OPTIONAL_STEP_INPUTS: dict[str, str] = {
    "fidelity": "models of the unset settings: accurate (kernel compute, FlashAttention, "
                "runtime memory model, NCCL's tuner unless algo is given) or paper (the PaRO "
                "paper's closed forms); empty = accurate (docs/sweeps.md)",
    "global_batch": "global batch per optimizer step as given: sequences (1024) or tokens "
                    "(4Mtok, 1Mitok, 4194304tokens); sets accum = global batch / (micro_batch "
                    "x data-parallel GPUs) (strong scaling: the same batch on more GPUs)",
    "efficiency": "fraction of peak FLOP/s that compute achieves (0..1; empty = the "
                  "default, docs/compute.md)",
    "compute_model": "flat or kernel (docs/compute.md); empty = the cluster's compute.model",
    "attention": "eager or flash; empty = the runtime's",
    "memory_model": "korthikanti or runtime (docs/memory.md); empty = the runtime's",
    "logit_bytes": "bytes per logit live at the loss (count); empty = the runtime's",
    "seed": "seed of the jitter draws, of a MoE routing's draws and of ECMP hashing (count; "
            "empty = 0)",
    "repeats": "steps simulated with jitter or drawn from a MoE routing (count; empty = 1); "
               "step_time_s is their mean",
    "jitter_cv": "lognormal compute jitter per op and rank, coefficient of variation "
                 "(fraction; empty = the cluster's)",
    "deepspeed_config": "a DeepSpeed JSON config path: runtime deepspeed, the strategy of its "
                        "stage, micro_batch / accum where it sets them (a different strategy, "
                        "micro_batch or accum in the point is refused)",
    "tp": "tensor-parallel degree (count; empty = 1)",
    "pp": "pipeline stages (count; empty = 1; accum is then the micro-batches per step)",
    "cp": "context-parallel degree, ring attention (count; empty = 1; seq_len divisible by "
          "2 x cp)",
    "sequence_parallel": "Megatron sequence parallelism: True or False (needs tp >= 2)",
    "tp_comm_overlap": "Megatron-Core / Transformer Engine TP communication overlap: True or "
                       "False (needs sequence_parallel)",
    "dp_comm_overlap": "Megatron-Core DP communication overlap (overlap_grad_reduce + "
                       "overlap_param_gather): True or False (needs tp or pp >= 2, PaRO NNN, "
                       "NNI or NNG)",
    "pp_schedule": "pipeline schedule: 1f1b or interleaved (empty = 1f1b)",
    "virtual_stages": "model chunks per stage of the interleaved schedule (count; empty = 2)",
    "tp_algo": "algorithm of TP collectives that cross nodes (empty = algo)",
}
# The inputs of a mixture-of-experts step (``parosim simulate``'s MoE flags): columns of a sweep
# that gives one of them or has a MoE model (a dense model refuses them per point).
MOE_STEP_INPUTS: dict[str, str] = {
    "ep": "expert parallelism: the routed experts split over ep ranks (count; empty = 1); on "
          "a MoE row the degree that applied",
    "expert_strategy": "PaRO strategy of the routed experts over the expert-data-parallel "
                       "group as given (empty = strategy's); on a MoE row the one that "
                       "applied (e.g. PaRO-GGG)",
    "a2a_algo": "dispatch / combine all-to-all: p2p, hierarchical-a2a, deepep-normal, "
                "deepep-ll or hybridep (empty = p2p); on a MoE row the one that applied",
    "routing": "token routing drawn per step (repeats steps): balanced, uniform, skew or "
               "zipf (empty = every expert its mean load)",
    "max_over_mean": "routing skew: the hot rank's load over the mean (factor >= 1; empty = "
                     "1.5)",
    "zipf": "routing zipf: the exponent (>= 0; empty = 1.0)",
}
_COMMON_OUTPUTS: dict[str, str] = {
    "status": "ok, does-not-fit (memory exceeds capacity) or error (bad combination)",
    "reason": "why a point is not ok (empty when ok)",
    "gpus": "GPUs in the job, n (count)",
}
_STEP_OUTPUTS: dict[str, str] = {
    "warnings": "the cautions simulate prints for the point, joined by ' | ' (empty when "
                "none): a GPU or precision without calibration rows, an MFU above every "
                "published run, a micro-batch far beyond the calibration rows, or more nodes "
                "than the cluster's calibrated_nodes (docs/accuracy.md)",
    "step_time_s": "time of one global step (s)",
    "tokens_per_s": "training throughput of the whole job (tokens/s)",
    "tokens_per_s_per_gpu": "throughput per GPU (tokens/s/GPU)",
    "samples_per_s": "throughput of the whole job (sequences/s)",
    "tflops_per_gpu": "hardware TFLOP/s per GPU: FLOPs executed, activation recomputation "
                      "included, / step time (1e12 FLOP/s); mfu counts model FLOPs only",
    "mfu": "model FLOPs utilisation: achieved / peak FLOP/s (fraction 0..1)",
    "exposed_comm_s": "communication time not hidden behind compute, per step (s)",
    "bytes_intra": "bytes sent per GPU per global step over intra-group links (bytes)",
    "bytes_inter": "bytes sent per GPU per global step over inter-group links (bytes)",
    "model_states_bytes": "parameters + gradients + optimizer states per GPU (bytes)",
    "activations_bytes": "activation memory per GPU (bytes)",
    "buffers_bytes": "gathered-layer, prefetch and communication buffers per GPU (bytes)",
    "total_bytes": "total memory per GPU incl. fragmentation margin (bytes)",
    "capacity_bytes": "GPU memory capacity (bytes)",
    "shortfall_bytes": "memory missing to fit, total_bytes - capacity_bytes when positive "
                       "(bytes)",
    "fits": "total_bytes <= capacity_bytes (True/False)",
}
# The outputs of a mixture-of-experts step: columns of a sweep with a MoE model, empty on its
# dense rows (docs/moe.md)
MOE_STEP_OUTPUTS: dict[str, str] = {
    "edp": "expert-data-parallel degree: replicas of each expert shard (count)",
    "ep_nodes": "nodes one EP group spans (count; EP x DP steps)",
    "a2a_size_bytes": "bytes per rank of one dispatch / combine all-to-all call (bytes; EP x "
                      "DP steps)",
    "a2a_per_step": "dispatch / combine all-to-all calls per global step (count; EP x DP "
                    "steps)",
    "expert_states_bytes": "parameters + gradients + optimizer states of the routed experts "
                           "per GPU (bytes; EP x DP steps)",
    "dense_states_bytes": "the same of the dense part (attention, router, shared experts, "
                          "embeddings) per GPU (bytes; EP x DP steps)",
    "balanced_step_s": "with routing: the step under forced balance (every expert its mean "
                       "load) (s); step_time_s is the mean over the drawn steps",
    "step_time_p50_s": "with routing: median of the drawn steps' times (s)",
    "step_time_p99_s": "with routing: 99th percentile of the drawn steps' times (s)",
    "step_time_max_s": "with routing: the slowest drawn step (s)",
    "imbalance_cost": "with routing: step_time_s / balanced_step_s - 1 (fraction)",
    "micro_batches": "micro-batches per step of the tp / pp closed form (count)",
    "bubble_fraction": "pipeline bubble / step time (fraction; 0 without pp)",
    "a2a_exposed_s": "tp / pp closed form: exposed all-to-all time per pipeline stage and "
                     "micro-batch, forward + backward (s)",
}
_COLL_INPUTS: dict[str, str] = {
    "kind": "point kind: collective",
    "mode": "engine (simpy flow-level replay) or analytic (closed-form alpha-beta)",
    "cluster": "cluster preset or YAML path",
    "nodes": "nodes in the cluster (count)",
    "group_nodes": "nodes per PaRO group (count)",
    "op": "all-gather, reduce-scatter or all-reduce",
    "scope": "global (all n GPUs), intra (each group) or inter (same local index across "
             "groups)",
    "size": "full buffer as given (nccl-tests: AG output, RS input, AR buffer)",
    "algo": "ring, hierarchical or ho-ring",
    "nic_bandwidth": "override of the per-NIC bandwidth as given; empty = the preset's",
    "intra_bandwidth": "override of the per-GPU intra-node bandwidth as given; empty = the "
                       "preset's",
}
_LINK_CLASSES = ("nvlink", "pcie", "nic", "uplink")
_COLL_OUTPUTS: dict[str, str] = {
    "ring_size": "k: ranks per ring instance of the scope (count)",
    "size_bytes": "full buffer (bytes)",
    "time_s": "collective time: simulated (engine) or closed form (analytic) (s)",
    "closed_form_s": "alpha-beta closed-form time of the same lowering (s)",
    "algbw_GBps": "algorithm bandwidth size_bytes / time_s (GB/s, 1e9 bytes/s)",
    "busbw_GBps": "nccl-tests bus bandwidth (GB/s, 1e9 bytes/s)",
    "chunks": "HO-Ring pipeline chunks (count; 1 for the others)",
    "events": "simpy events scheduled (count; 0 in analytic mode)",
    **{f"bytes_{c}": f"bytes carried by all {c} links together (bytes; engine mode only)"
       for c in _LINK_CLASSES},
    **{f"busy_s_{c}": f"busy time of the busiest {c} link (s; engine mode only)"
       for c in _LINK_CLASSES},
}

COLUMNS: dict[str, dict[str, str]] = {
    "step": {**_ID_COLUMNS, **_STEP_INPUTS, **_COMMON_OUTPUTS, **_STEP_OUTPUTS},
    "collective": {**_ID_COLUMNS, **_COLL_INPUTS, **_COMMON_OUTPUTS, **_COLL_OUTPUTS},
}
INPUT_KEYS: dict[str, tuple[str, ...]] = {
    "step": tuple(k for k in _STEP_INPUTS if k != "kind") + tuple(OPTIONAL_STEP_INPUTS)
    + tuple(CLUSTER_SET_INPUT) + tuple(MOE_STEP_INPUTS),
    "collective": tuple(k for k in _COLL_INPUTS if k != "kind") + tuple(CLUSTER_SET_INPUT),
}


def sweep_columns(kind: str, keys=(), moe: bool = False) -> dict[str, str]:
    """The columns of ``results.csv`` (name -> meaning): :data:`COLUMNS` of the kind, with
    the optional inputs among ``keys`` (the spec's grid and fixed keys) after the other
    inputs; ``moe`` (a step sweep with a mixture-of-experts model): every MoE input, and the
    MoE outputs after the others (a sweep without MoE keeps its columns)."""
    cols = COLUMNS[kind]
    extra = {k: v for k, v in OPTIONAL_STEP_INPUTS.items() if k in keys} \
        if kind == "step" else {}
    extra.update({k: v for k, v in CLUSTER_SET_INPUT.items() if k in keys})
    if kind == "step":
        extra.update({k: v for k, v in MOE_STEP_INPUTS.items() if moe or k in keys})
    outputs = MOE_STEP_OUTPUTS if kind == "step" and moe else {}
    if not extra and not outputs:
        return dict(cols)
    names = list(cols)
    i = names.index("status")
    return {**{k: cols[k] for k in names[:i]}, **extra, **{k: cols[k] for k in names[i:]},
            **outputs}


def columns_markdown(kind: str, keys=(), moe: bool = False) -> str:
    """The column documentation of ``results.csv`` as a Markdown table (``columns.md``)."""
    lines = [f"# results.csv columns ({kind} sweep)", "",
             "One row per grid point, in grid order (first grid key slowest). Empty cell = not "
             "applicable or not given.", "", "| column | meaning (unit) |", "|---|---|"]
    lines += [f"| `{k}` | {v} |" for k, v in sweep_columns(kind, keys, moe).items()]
    return "\n".join(lines) + "\n"
