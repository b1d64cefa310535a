"""``parosim model``: what a model is, dense or mixture of experts: its parameters by part,
total and active per token, and the training FLOPs per token (docs/moe.md).
"""

from __future__ import annotations

import argparse

from ..errors import InputError


def add_arguments(sub) -> None:
    """The ``model`` subcommand's flags."""
    m = sub.add_parser("model", help="a model's parameters by part, total and active per "
                       "token, FLOPs per token (dense or mixture of experts)",
                       epilog="examples:\n  parosim model --model mixtral-8x7b\n"
                       "  parosim model --model deepseek-v3 --seq-len 4096 --json")
    m.add_argument("--model", default="llama-7b",
                   help="preset name, model YAML or HuggingFace config.json")
    m.add_argument("--seq-len", type=int, default=4096,
                   help="sequence length of the attention-score FLOPs")
    m.add_argument("--json", action="store_true", help="machine-readable result on stdout")


def cmd_model(a: argparse.Namespace) -> dict:
    from ..io.model import load_model  # deferred: loaded when the command runs (start-up)
    from ..spec.model import (  # deferred: loaded when the command runs (start-up)
        is_preset,
        preset_source,
    )
    from ..spec.moe import flops_per_token  # deferred: loaded when the command runs (start-up)

    if a.seq_len < 1:
        raise InputError(f"--seq-len {a.seq_len} must be a positive number of tokens")
    model = load_model(a.model)
    model.require_shape("parosim model", extended_ok=True)
    c = model.param_counts
    d: dict = {"model": model.name, "source": preset_source(a.model) if is_preset(a.model)
               else str(a.model), "moe": model.is_moe,
               "layers": model.layers, "hidden": model.hidden, "heads": model.heads,
               "vocab": model.vocab}
    if model.moe is not None:
        d["experts"] = model.moe.as_dict()
    if model.attention is not None:
        d["attention"] = model.attention.as_dict()
    d["params"] = {k: v for k, v in c.as_dict().items()}
    d["seq_len"] = a.seq_len
    d["flops_per_token"] = flops_per_token(model, a.seq_len)
    d["flops_per_token_6n"] = 6.0 * c.active_matmul
    return d


def show_model(d: dict) -> None:
    p = d["params"]
    print(f"{d['model']}  ({d['source']})")
    print(f"  {d['layers']} layers x hidden {d['hidden']}, {d['heads']} heads, "
          f"vocab {d['vocab']}")
    if d["moe"]:
        e = d["experts"]
        shared = f" + {e['shared_experts']} shared" if e["shared_experts"] else ""
        cf = ("dropless" if e["capacity_factor"] is None
              else f"capacity factor {e['capacity_factor']:g}")
        print(f"  experts: {e['experts']} routed{shared}, top-{e['top_k']}, expert ffn "
              f"{e['expert_ffn']}, {e['dense_layers']} dense layers first, {cf}")
    rows = [("attention", p["attention"]), ("dense MLP", p["dense_mlp"]),
            ("routed experts", p["routed_experts"]), ("shared experts", p["shared_experts"]),
            ("router", p["router"]), ("norms", p["norms"]), ("embedding", p["embedding"]),
            ("head", p["head"])]
    for name, n in rows:
        if n:
            print(f"  {name:<16}{n:>18,}")
    print(f"  {'total':<16}{p['total']:>18,}  ({p['total'] / 1e9:.2f}B)")
    print(f"  {'active':<16}{p['active']:>18,}  ({p['active'] / 1e9:.2f}B; "
          f"{p['active_no_embedding'] / 1e9:.2f}B without the embedding)")
    print(f"  training FLOPs per token at seq {d['seq_len']}: "
          f"{d['flops_per_token'] / 1e9:.1f} GFLOP (6 x active matmul weights: "
          f"{d['flops_per_token_6n'] / 1e9:.1f} GFLOP)")
