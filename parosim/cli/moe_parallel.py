"""The text form of ``parosim simulate`` of a mixture-of-experts model with ``--tp`` or
``--pp`` > 1: the closed-form MoE step under TP x PP (VP) x CP x EP with the parameters fitted
on Megatron-Bridge's published throughput (docs/moe.md, "From the command line"). The step
itself, and the one-line refusal of every flag it cannot honour, is
:func:`parosim.simulate.moe_flags.moe_parallel_step` (a sweep point runs it too). Analytic
mode only: the engine does not replay these steps yet.
"""

from __future__ import annotations


def show_moe_parallel(r: dict) -> None:
    """The text form of :func:`cmd_simulate_moe_parallel`'s result."""
    s, c = r["stage_microbatch_s"], r["calibration"]
    print(f"{r['model']} on {r['cluster']} ({r['gpus']} GPUs), mode analytic: MoE closed "
          "form (TP x PP x VP x CP x EP, docs/moe.md)")
    print(f"TP {r['tp']} x PP {r['pp']} ({r['virtual_stages']} chunk(s) per stage) x CP "
          f"{r['cp']} x DP {r['dp']}; EP {r['ep']}, EDP {r['edp']}; {r['micro_batches']} "
          f"micro-batches of {r['micro_batch']} x {r['seq_len']} tokens "
          f"(global batch {r['global_batch_seqs']} seqs), {r['precision']}"
          f"{', sequence parallel' if r['tp'] > 1 else ''}")
    print(f"step {r['step_time_s']:.4f} s, {r['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, "
          f"bubble {r['bubble_s']:.4f} s ({100 * r['bubble_fraction']:.1f} %)")
    print("per stage and micro-batch, forward + backward (ms): " + ", ".join(
        f"{name} {1e3 * s[k]:.2f}" for name, k in (
            ("GEMMs", "gemm_s"), ("expert GEMMs", "grouped_gemm_s"),
            ("attention", "attention_s"), ("memory-bound", "memory_s"),
            ("all-to-all (exposed)", "a2a_s"), ("TP", "tp_s"), ("host", "host_s")))
          + f"; per step: p2p {r['p2p_s']:.4f} s, optimizer {r['optimizer_s']:.4f} s")
    print(f"parameters fitted on Megatron-Bridge rows for {c['hardware']} ({c['release']}): "
          f"GEMM ceiling {c['gemm_efficiency']:.3f}, a2a exposed {c['a2a_exposed']:.3f}, "
          f"host {1e3 * c['moe_layer_overhead_s']:.2f} ms per MoE layer; memory not checked")
