"""The ``parosim`` command line: parse, call io and the core, print. Nothing else.

Bad input gives one line on stderr and exit code 2 (never a traceback).

The command registry: each command module (:mod:`.step`, :mod:`.memory`,
:mod:`.collective`, :mod:`.sweep`, :mod:`.validate`, :mod:`.studies`, :mod:`.calibrate`) holds a
``cmd_NAME`` (flags -> result dict) and a ``show_NAME`` (result -> text); the parser is
:mod:`.parser`, the shared set-up :mod:`.setup`, text tables :mod:`.tables`. Only the module
of the command that runs is imported, and only its flags are built (start-up time).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable

from ..errors import InputError
from .parser import build_parser

# command -> its module (cmd_NAME and show_NAME, show_NAME None where JSON is the only output):
# a command's module (and what it imports) is loaded only when that command runs (start-up)
COMMANDS: dict[str, str] = {
    "advise": "studies", "calibrate": "calibrate", "cluster": "cluster", "sweep": "sweep",
    "validate": "validate", "collective": "collective", "simulate": "step", "compare": "step",
    "memory": "memory", "model": "model", "experts": "experts", "run": "studies",
}


def command(name: str) -> tuple[Callable, Callable | None]:
    """(cmd_NAME, show_NAME) of a command, importing its module now."""
    mod = importlib.import_module(f"{__package__}.{COMMANDS[name]}")
    return getattr(mod, f"cmd_{name}"), getattr(mod, f"show_{name}", None)


# Internal field names that core modules put in messages -> the flags a CLI user typed.
_FLAGS = {"micro_batch": "--micro-batch", "accum_steps": "--accum", "seq_len": "--seq-len",
          "compute_efficiency": "--efficiency", "overlap_slowdown": "--overlap-slowdown",
          "trainable ratio": "--trainable-ratio", "trainable_ratio": "--trainable-ratio",
          "nodes": "--nodes", "group_nodes": "--group-nodes", "logit_bytes": "--logit-bytes"}


# What an empty value of a flag should have been (the others: "a value").
_EMPTY_HINTS = {"runtime": "ideal, deepspeed, fsdp, paro or a runtime YAML path",
                "ds_config": "a DeepSpeed JSON config path",
                "deepspeed_config": "a DeepSpeed JSON config path",
                "minbytes": "a size such as '8' or '1M'", "maxbytes": "a size such as '8G'",
                "strategies": "a comma list of strategies such as NIG,GGG, or all",
                "strategy": "a strategy such as NIG, or all",
                "compare": "an nccl-tests log path", "nccl_tests": "an nccl-tests log path",
                "trace": "a file path", "plot": "a file path", "link_timeline": "a file path",
                "jobs": "a jobs YAML path", "spec": "a sweep spec YAML path",
                "out": "a directory path"}
# flags whose own parser already names the empty value ('' ) in its message
_EMPTY_OWN = {"model", "global_batch", "tokens", "trainable_ratio", "algo", "op", "size",
              "cluster", "gpu_memory", "nic_bandwidth", "intra_bandwidth", "scheduler",
              "checkpoint_time", "restart_time", "checkpoint_interval", "gpu_mtbf", "node_mtbf"}


def _no_empty_values(parser: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """A flag given an empty (or blank) string is refused with one line naming it: never
    read as 'not given' (which silently ran with the default)."""
    sub = next(x for x in parser._actions if isinstance(x, argparse._SubParsersAction))
    for act in sub.choices[a.command]._actions:
        if (act.dest in _EMPTY_OWN or not hasattr(a, act.dest)
                or (a.command, act.dest) == ("validate", "strategies")):  # '': no step runs
            continue
        val = getattr(a, act.dest)
        if val == act.default:   # not given (a default may be '', as validate's --parallel)
            continue
        vals = val if isinstance(val, list) else [val]
        if any(isinstance(v, str) and not v.strip() for v in vals):
            opts = act.option_strings
            flag = "/".join(opts) if opts else act.dest   # every spelling: -b/--minbytes
            hint = _EMPTY_HINTS.get(act.dest, f"a value (see parosim {a.command} --help)")
            raise InputError(f"{flag} is empty; expected {hint}")


def _flag_names(msg: str) -> str:
    """``micro_batch = 0 must be ...`` -> ``--micro-batch = 0 must be ...``."""
    for field_name, flag in _FLAGS.items():
        if msg.startswith(field_name + " "):
            return flag + msg[len(field_name):]
    return msg


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    first = next((x for x in args if not x.startswith("-")), None)
    parser = build_parser(first if first in COMMANDS else None)
    a = parser.parse_args(args)
    run, show = command(a.command)
    try:
        _no_empty_values(parser, a)
        res = run(a)
    except InputError as e:
        msg = str(e) if a.command == "sweep" else _flag_names(str(e))  # sweep: YAML keys
        print(f"parosim: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("parosim: interrupted (a sweep resumes when run again)", file=sys.stderr)
        return 130
    try:
        if getattr(a, "json", False) or show is None:
            json.dump(res, sys.stdout, indent=2, sort_keys=False)
            sys.stdout.write("\n")
        else:
            show(res)
        sys.stdout.flush()
    except BrokenPipeError:  # `parosim ... | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if a.command == "simulate" and res.get("fits") is False:
        # the breakdown is printed above (nothing computed is lost); the step was not
        # simulated, which the exit code says
        from ..units import fmt_bytes

        mem = res["memory"]
        print(f"parosim: error: {res['strategy']} does not fit: it needs "
              f"{fmt_bytes(mem['total_bytes'])} per GPU and the GPU has "
              f"{fmt_bytes(mem['capacity_bytes'])} (short by "
              f"{fmt_bytes(mem['shortfall_bytes'])}); expected a configuration that fits, "
              "see 'parosim memory'", file=sys.stderr)
        return 2
    return 0
