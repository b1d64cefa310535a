"""Two training jobs on one two-tier Ethernet cluster: slowdown by placement and uplink
oversubscription.

Cluster: ``eth-2tier-a100`` (16 nodes of 8 A100, 2 x 100 GbE per node, 8 nodes per leaf),
its leaf uplinks oversubscribed 1:1 to 8:1 (the preset's is 4:1). Two identical LLaMA-7B
jobs of 8 nodes each (micro-batch 4, s = 2, sequence 512, HO-Ring), ZeRO-3 (GGG: every
micro-step's gathers and reduce-scatters cross the NICs) and PaRO-IIG (only the boundary
sync crosses them). Placements: each job on its own leaf; each job on half of each leaf;
nodes interleaved (every ring hop crosses the leaves).

Checks (the script fails otherwise): one leaf per job never slows down (they share no
link); no slowdown exceeds 2 (with two jobs max-min fairness leaves each at least half of
every link it shares, so no phase takes more than twice as long).

    python experiments/10_jobs_sharing/sharing.py      # about a minute of CPU

Writes ``out/results.csv`` (columns below) and ``out/figures/slowdown.png``; ``--figures``
redraws the figure from the committed results.csv only.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from parosim.io import load_cluster
from parosim.plots.figures import save_as
from parosim.spec.model import preset
from parosim.spec.training import TrainingSpec
from parosim.studies.jobs import make_job, run_jobs

OUT = Path(__file__).resolve().parent / "out"
PLACEMENTS = {
    "one leaf per job": ((0, 1, 2, 3, 4, 5, 6, 7), (8, 9, 10, 11, 12, 13, 14, 15)),
    "half of each leaf": ((0, 1, 2, 3, 8, 9, 10, 11), (4, 5, 6, 7, 12, 13, 14, 15)),
    "interleaved": ((0, 8, 1, 9, 2, 10, 3, 11), (4, 12, 5, 13, 6, 14, 7, 15)),
}
OVERSUB = (1, 2, 4, 8)
STRATEGIES = ("GGG", "IIG")
TRAIN = TrainingSpec(accum_steps=2)
COLUMNS = {"strategy": "PaRO strategy of both jobs", "placement": "node placement",
           "oversubscription": "leaf downlink : uplink capacity",
           "step_time_alone_s": "job a's step alone, s", "step_time_shared_s": "with job b, s",
           "slowdown": "shared / alone", "top_link": "busiest link of the shared run",
           "top_link_utilization": "its bytes / (capacity x shared duration)"}


def main() -> int:
    base = load_cluster("eth-2tier-a100")
    rows, fails = [], []
    for s in STRATEGIES:
        for o in OVERSUB:
            c = replace(base, network=replace(base.network, oversubscription=float(o)))
            for place, (na, nb) in PLACEMENTS.items():
                jobs = [make_job(n, preset("llama-7b"), s, c, nd, TRAIN, "ho-ring")
                        for n, nd in (("a", na), ("b", nb))]
                r = run_jobs(c, jobs)
                a = r.jobs[0]
                rows.append({"strategy": s, "placement": place, "oversubscription": o,
                             "step_time_alone_s": a.step_time_alone_s,
                             "step_time_shared_s": a.step_time_shared_s,
                             "slowdown": a.slowdown, "top_link": r.busiest_links[0]["link"],
                             "top_link_utilization": r.busiest_links[0]["utilization"]})
                sd = [j.slowdown for j in r.jobs]
                if place == "one leaf per job" and any(abs(x - 1) > 1e-9 for x in sd):
                    fails.append(f"{s} {o}:1 one leaf per job: slowdown {sd}")
                if any(x > 2 + 1e-9 for x in sd):
                    fails.append(f"{s} {o}:1 {place}: slowdown {sd} > 2")
                print(f"{s} {o}:1 {place:<18} alone {a.step_time_alone_s:7.3f} s shared "
                      f"{a.step_time_shared_s:7.3f} s slowdown {a.slowdown:.3f}", flush=True)
    df = pd.DataFrame(rows)
    (OUT / "figures").mkdir(parents=True, exist_ok=True)
    df.to_csv(OUT / "results.csv", index=False)
    (OUT / "columns.md").write_text("# results.csv columns\n\n" + "".join(
        f"- `{k}`: {v}\n" for k, v in COLUMNS.items()))
    save_as(slowdown_figure(df), OUT / "figures" / "slowdown.png")
    for f in fails:
        print("CHECK FAILED:", f, file=sys.stderr)
    return 1 if fails else 0


def slowdown_figure(df: pd.DataFrame) -> Figure:
    fig = Figure(figsize=(10, 4.2), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    for ax, (s, g) in zip(axes, df.groupby("strategy"), strict=True):
        for place, h in g.groupby("placement", sort=False):
            ax.plot(h.oversubscription, h.slowdown, "o-", label=place)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(OVERSUB), [f"{o}:1" for o in OVERSUB])
        ax.set_xlabel("leaf uplink oversubscription (ratio, downlink : uplink)")
        ax.set_title(f"PaRO-{s}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("step-time slowdown (ratio: shared / alone)")
    axes[0].legend(fontsize=8)
    fig.suptitle("step-time slowdown (ratio) from sharing the leaf uplinks: two LLaMA-7B jobs "
                 "(8 nodes each)\non eth-2tier-a100 (16 x 8 A100)", fontsize=10)
    return fig


if __name__ == "__main__":
    if sys.argv[1:] == ["--figures"]:
        OUT.joinpath("figures").mkdir(parents=True, exist_ok=True)
        save_as(slowdown_figure(pd.read_csv(OUT / "results.csv")),
                OUT / "figures" / "slowdown.png")
    else:
        sys.exit(main())
