"""``parosim experts``: expert parallelism of a mixture-of-experts model on a cluster: the
EP / EDP groups, expert and dense model states per GPU under every expert sharding level,
the expert-parameter traffic, and one MoE layer's dispatch / combine (docs/moe.md).
"""

from __future__ import annotations

import argparse

from ..errors import InputError
from .actions import Explicit
from .setup import refuse_unused_routing

# what frameworks call the expert sharding levels (docs/moe.md)
EXPERT_SYSTEMS = {
    "NNN": "expert DDP (DeepSpeed-MoE ZeRO-0)",
    "NNG": "Megatron-Core distributed optimizer / DeepSpeed-MoE ZeRO-1",
    "NGG": "DeepSpeed-MoE ZeRO-2",
    "GGG": "ZeRO-3 / Megatron-FSDP of the experts",
}


def add_arguments(sub) -> None:
    """The ``experts`` subcommand's flags."""
    e = sub.add_parser("experts", help="expert parallelism of a MoE model: EP / EDP groups, "
                       "expert states per GPU for each expert sharding level, expert traffic, "
                       "dispatch / combine bytes and time",
                       epilog="examples:\n  parosim experts --model mixtral-8x7b --cluster "
                       "dgx-h100-ib --nodes 2 --ep 8\n  parosim experts --model qwen3-30b-a3b "
                       "--cluster dgx-h100-ib --nodes 4 --ep 16 --expert-strategy IIG --json")
    e.add_argument("--model", default="mixtral-8x7b", help="a MoE preset, YAML or config.json")
    e.add_argument("--cluster", default="dgx-h100-ib", help="preset name or YAML path")
    e.add_argument("--nodes", type=int, default=None, help="override the node count")
    e.add_argument("--group-nodes", type=int, default=None,
                   help="nodes per PaRO group (default 1: a group is a node)")
    for flag, what in (("--tp", "tensor parallelism of the dense layers"),
                       ("--pp", "pipeline stages"), ("--cp", "context parallelism"),
                       ("--ep", "expert parallelism (experts split over EP ranks)"),
                       ("--etp", "expert tensor parallelism")):
        e.add_argument(flag, type=int, default=1, help=what)
    e.add_argument("--strategy", default="NNG",
                   help="PaRO strategy of the dense parameters over the DP x CP group")
    e.add_argument("--expert-strategy", default="all",
                   help="PaRO strategy of the routed experts over the EDP group, or 'all'")
    e.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-batch")
    e.add_argument("--seq-len", type=int, default=4096, help="tokens per sequence")
    e.add_argument("--accum", type=int, default=1,
                   help="gradient-accumulation micro-steps per step (expert traffic)")
    e.add_argument("--routing", default=None,
                   help="simulate one MoE layer (forward + backward) on the engine with token "
                   "routing drawn per step: balanced | uniform | skew | zipf (docs/moe.md)")
    e.add_argument("--a2a-algo", default=None,
                   help="dispatcher of the layer (--routing) and of the dispatch time: "
                   "p2p (default: NCCL's all-to-all, per flow) | deepep-normal | deepep-ll "
                   "| hybridep (DeepEP's kernels, costs collective.ep_normal / ep_ll / "
                   "ep_hybrid: fitted in dgx-h800-ib, ideal defaults elsewhere; docs/moe.md)")
    e.add_argument("--max-over-mean", type=float, default=1.5, action=Explicit,
                   help="--routing skew only: the hot rank's load over the mean")
    e.add_argument("--zipf", type=float, default=1.0, action=Explicit,
                   help="--routing zipf only: the exponent")
    e.add_argument("--seed", type=int, default=0, action=Explicit,
                   help="seed of the routing draws (with --routing)")
    e.add_argument("--draws", type=int, default=20, action=Explicit,
                   help="steps drawn with --routing")
    e.add_argument("--plot", default=None,
                   help="with --routing: write the layer-time distribution to FILE (.png, "
                   ".svg, .pdf)")
    e.add_argument("--json", action="store_true", help="machine-readable result on stdout")


def cmd_experts(a: argparse.Namespace) -> dict:
    from ..collectives.alltoall import (  # deferred: loaded when the command runs (start-up)
        lower_alltoall,
    )
    from ..collectives.cost import program_time  # deferred: loaded when the command runs
    from ..collectives.types import Algo, Scope  # deferred: loaded when the command runs
    from ..io import load_cluster  # deferred: loaded when the command runs (start-up)
    from ..io.model import load_model  # deferred: loaded when the command runs (start-up)
    from ..plan.experts import (  # deferred: loaded when the command runs (start-up)
        ExpertLayout,
        dense_params_per_gpu,
        dense_states_bytes,
        dispatch_bytes,
        expert_params_per_gpu,
        expert_states_bytes,
        expert_traffic,
    )
    from ..spec.strategy import (  # deferred: loaded when the command runs (start-up)
        ALL_STRATEGIES,
        parse_strategy,
    )
    from ..spec.training import TrainingSpec  # deferred: loaded when the command runs

    model = load_model(a.model)
    if not model.is_moe:
        raise InputError(f"model {model.name!r} has no experts; parosim experts needs a "
                         "mixture of experts (e.g. --model mixtral-8x7b); dense models: "
                         "parosim memory / simulate")
    refuse_unused_routing(a)
    for dest, flag in (("seed", "--seed"), ("draws", "--draws")):
        if getattr(a, f"_given_{dest}", False) and a.routing is None:
            raise InputError(f"{flag} {getattr(a, dest)} is of the drawn routing of the layer; "
                             "got no --routing; expected it unset or a --routing")
    cluster = load_cluster(a.cluster, a.nodes, a.group_nodes)
    lay = ExpertLayout(cluster, model.moe.experts, ep=a.ep, etp=a.etp, tp=a.tp, pp=a.pp,
                       cp=a.cp)
    training = TrainingSpec(micro_batch=a.micro_batch, seq_len=a.seq_len, accum_steps=a.accum)
    dense = parse_strategy(a.strategy)
    strategies = (list(ALL_STRATEGIES) if a.expert_strategy == "all"
                  else [parse_strategy(a.expert_strategy)])
    dense_b = dense_states_bytes(model, dense, lay)
    rows = []
    for s in strategies:
        exp_b = expert_states_bytes(model, s, lay)
        coll = expert_traffic(model, s, lay, a.accum)
        rows.append({"expert_strategy": s.name, "expert_system": EXPERT_SYSTEMS.get(s.short, ""),
                     "expert_states_bytes": exp_b, "dense_states_bytes": dense_b,
                     "states_bytes": exp_b + dense_b,
                     "fits_states": exp_b + dense_b <= cluster.gpu.memory_bytes,
                     "expert_traffic_bytes_per_gpu": sum(c["bytes_per_gpu"] for c in coll),
                     "expert_collectives": coll})
    d = {"model": model.name, "cluster": cluster.name, "gpus": cluster.gpus,
         "capacity_bytes": cluster.gpu.memory_bytes,
         "layout": {"tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "dp": lay.dp, "ep": lay.ep,
                    "etp": lay.etp, "edp": lay.edp, "m_dp": lay.m_dp, "m_edp": lay.m_edp,
                    "ep_nodes": lay.ep_nodes, "ep_group": list(lay.ep_groups(0)[0]),
                    "edp_group": list(lay.edp_groups(0)[0])},
         "strategy": dense.name,
         "settings": {"micro_batch": a.micro_batch, "seq_len": a.seq_len, "accum": a.accum,
                      "nodes": cluster.nodes, "group_nodes": cluster.group_nodes},
         "params": {"expert_per_gpu": expert_params_per_gpu(model, lay),
                    "dense_per_gpu": dense_params_per_gpu(model, lay)},
         "results": rows}
    if lay.ep > 1 and lay.tp == 1 and lay.etp == 1:
        disp = dispatch_bytes(model, training, lay)
        groups = [list(g) for g in lay.ep_groups(0)]
        for algo in (Algo.P2P, Algo.HIERARCHICAL_A2A):
            prog = lower_alltoall(cluster, Scope.GLOBAL, disp["a2a_size_bytes"], algo, groups)
            disp[f"{algo.value.replace('-', '_')}_time_s"] = program_time(cluster, prog)
        ep_disp = None
        if a.a2a_algo is not None:
            from ..collectives.deepep import (  # deferred: loaded when the flag is given
                EPCall,
                EPDispatcher,
                bf16_token_bytes,
                deepep_routing,
                lower_ep_groups,
            )

            names = ("p2p", *(x.value for x in EPDispatcher))
            key = str(a.a2a_algo).strip().lower()
            if key not in names:
                raise InputError(f"--a2a-algo {a.a2a_algo!r} is not a dispatcher of parosim "
                                 f"experts; expected one of {', '.join(names)}")
            disp["a2a_algo"] = key
            if key != "p2p":
                ep_disp = EPDispatcher(key)
                r = deepep_routing(lay.ep, cluster.gpus_per_node, model.moe.experts,
                                   model.moe.top_k, grouped=False)
                call = EPCall(ep_disp.kernel, "dispatch", disp["tokens_per_rank"],
                              bf16_token_bytes(model.hidden), r)
                prog = lower_ep_groups(cluster, call, groups)
                disp[f"{key.replace('-', '_')}_time_s"] = program_time(cluster, prog)
                disp["deepep"] = {"kernel": ep_disp.kernel, "p_rank": r.p_rank,
                                  "p_node": r.p_node,
                                  "token_bytes": bf16_token_bytes(model.hidden)}
        d["dispatch"] = disp
        if a.routing is not None:
            from ..evaluate.moe_layer import (  # deferred: numpy and simpy, only when asked
                Routing,
                layer_distribution,
            )

            routing = Routing(a.routing, a.max_over_mean, a.zipf, a.seed)
            d["moe_layer"] = layer_distribution(cluster, model, groups, disp["rows"],
                                                training, routing, a.draws, ep_disp,
                                                disp["tokens_per_rank"])
            if "a2a_algo" in disp:
                d["moe_layer"]["a2a_algo"] = disp["a2a_algo"]
            if a.plot:
                from ..plots.moe import (  # deferred: matplotlib, only when a plot is asked
                    plot_layer_distribution,
                )

                title = (f"{model.name}, EP {lay.ep} on {cluster.name} ({cluster.gpus} GPUs), "
                         f"micro-batch {a.micro_batch} x seq {a.seq_len}")
                d["plot"] = str(plot_layer_distribution(d["moe_layer"], a.plot, title))
    elif a.routing is not None or a.a2a_algo is not None:
        flag = "--routing" if a.routing is not None else "--a2a-algo"
        raise InputError(f"{flag} needs --ep > 1 and --tp 1 --etp 1 (got --ep {a.ep} --tp "
                         f"{a.tp} --etp {a.etp}): the layer is simulated over the EP groups "
                         "with the all-to-all dispatcher")
    if a.plot and "moe_layer" not in d:
        raise InputError("--plot draws the layer-time distribution: it goes with --routing")
    return d


def show_experts(d: dict) -> None:
    from ..units import fmt_bytes, fmt_time  # deferred: loaded when the command runs

    lay, st = d["layout"], d["settings"]
    print(f"settings: micro-batch {st['micro_batch']} x seq {st['seq_len']}, accum "
          f"{st['accum']}, PaRO groups of {st['group_nodes']} node(s)")
    print(f"{d['model']} on {d['cluster']}, {d['gpus']} GPUs: TP {lay['tp']} PP {lay['pp']} "
          f"CP {lay['cp']} DP {lay['dp']}; experts EP {lay['ep']} x ETP {lay['etp']} x "
          f"EDP {lay['edp']} (EP group spans {lay['ep_nodes']} node(s); {lay['m_edp']} EDP "
          "rank(s) per PaRO group)")
    p = d["params"]
    print(f"per GPU: {p['expert_per_gpu'] / 1e9:.3f}B expert parameters, "
          f"{p['dense_per_gpu'] / 1e9:.3f}B dense (dense strategy {d['strategy']})")
    print(f"{'expert strategy':<18}{'expert states':>15}{'dense states':>14}{'total':>12}"
          f"{'expert traffic/step':>21}  equivalent")
    for r in d["results"]:
        print(f"{r['expert_strategy']:<18}{fmt_bytes(r['expert_states_bytes']):>15}"
              f"{fmt_bytes(r['dense_states_bytes']):>14}{fmt_bytes(r['states_bytes']):>12}"
              f"{fmt_bytes(r['expert_traffic_bytes_per_gpu']):>21}  {r['expert_system']}")
    if "dispatch" in d:
        x = d["dispatch"]
        print(f"one MoE layer, one micro-batch: dispatch all-to-all of "
              f"{fmt_bytes(x['a2a_size_bytes'])} per rank ({fmt_bytes(x['remote_bytes'])} leave "
              f"it), p2p {fmt_time(x['p2p_time_s'])}, hierarchical-a2a "
              f"{fmt_time(x['hierarchical_a2a_time_s'])}; combine the same; forward and "
              f"backward: {x['all_to_alls_per_layer']} all-to-alls")
        for key in ("deepep_normal", "deepep_ll", "hybridep"):
            if f"{key}_time_s" in x:
                print(f"  {key.replace('_', '-')} dispatch of bf16 tokens: "
                      f"{fmt_time(x[key + '_time_s'])} (p_rank {x['deepep']['p_rank']:.4f})")
    if "moe_layer" in d:
        y = d["moe_layer"]
        via = f" ({y['a2a_algo']})" if "a2a_algo" in y else ""
        print(f"one MoE layer on the engine{via}, routing {y['routing']} (seed {y['seed']}, "
              f"{y['draws']} steps): balanced {fmt_time(y['balanced_s'])} (closed form "
              f"{fmt_time(y['closed_form_s'])}); mean {fmt_time(y['mean_s'])}, p50 "
              f"{fmt_time(y['p50_s'])}, p99 {fmt_time(y['p99_s'])}, max {fmt_time(y['max_s'])}; "
              f"cost of imbalance {100 * y['imbalance_cost']:+.1f} %")
