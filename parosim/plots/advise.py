"""The Pareto plot of ``parosim advise --plot FILE`` (an edge module: matplotlib).

Every configuration that was costed is a grey point (memory per GPU, throughput); the Pareto
front (no costed configuration uses less memory and runs faster) is the red staircase; the top
N are numbered as in the printed table; the GPU memory is a dashed line. Configurations pruned
by the search (their compute-only throughput bound is below a costed configuration that also
uses no more memory) are dominated by construction and not drawn; their count is in the legend.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from ..errors import InputError


def pareto_figure(res: dict) -> Figure:
    """The figure of an :func:`parosim.studies.advise.advise` result."""
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.add_subplot()
    pts = [(m / 2**30, t) for m, t in res["points"] if t == t]
    ax.scatter([m for m, _ in pts], [t for _, t in pts], s=8, color="#999", alpha=0.5,
               label=f"costed configurations ({len(pts)}; {res.get('pruned', 0)} pruned "
                     "by the compute bound)")
    front = sorted(res["pareto_front"])
    if front:
        ax.plot([m / 2**30 for m, _ in front], [t for _, t in front], color="#d62728",
                marker="o", markersize=4, drawstyle="steps-post",
                label="Pareto front (closed form)")
    for i, c in enumerate(res["candidates"], 1):
        ax.scatter([c["memory_bytes"] / 2**30], [c["tokens_per_s"]], marker="*", s=120,
                   color="#1f77b4", zorder=3, label="top configurations" if i == 1 else None)
    if res["candidates"]:
        cap = res["candidates"][0]["capacity_bytes"] / 2**30
        ax.axvline(cap, color="k", linestyle="--", linewidth=1, label="GPU memory")
    ax.set_xlabel("memory per GPU (GiB)")
    ax.set_ylabel("throughput (tokens/s)")
    top = max([t for _, t in pts] + [c["tokens_per_s"] for c in res["candidates"]],
              default=1.0)
    ax.set_ylim(0, top * (1.08 + 0.045 * len(res["candidates"])))  # room for the labels
    fig.suptitle(f"throughput (tokens/s) vs memory per GPU (GiB): {res['model']} on "
                 f"{res['cluster']} ({res['gpus']} GPUs)\nglobal batch "
                 f"{res['global_batch_sequences']} x {res['seq_len']} tokens; closed form, "
                 "stars: the top configurations as ranked", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    _number_candidates(fig, ax, res["candidates"])
    return fig


def _number_candidates(fig: Figure, ax, cands: list[dict]) -> None:
    """Label the top configurations #1, #2, ... beside their stars. The top configurations
    often sit close together: each label takes the first free place around its star (above
    right, below right, above left, below left), else the first free place above them, tied
    to its star by a thin line (positions in points, on the final layout)."""
    fig.draw_without_rendering()   # the constrained layout, so display positions are final
    per_pt = fig.dpi / 72.0
    height, width = 11.0, 18.0     # a label's box in points (fontsize 8, "#n"), with a gap
    placed: list[tuple[float, float]] = []   # lower-left corners of placed labels, in points

    def free(x: float, y: float) -> bool:
        return all(abs(x - qx) >= width or abs(y - qy) >= height for qx, qy in placed)

    for i, c in enumerate(cands, 1):
        xy = (c["memory_bytes"] / 2**30, c["tokens_per_s"])
        px, py = (v / per_pt for v in ax.transData.transform(xy))
        spots = [(px + 4, py + 3), (px + 4, py - 13), (px - 22, py + 3), (px - 22, py - 13)]
        x, y = next((s for s in spots if free(*s)), spots[0])
        tied = not free(x, y)
        while not free(x, y):
            y += height
        placed.append((x, y))
        ax.annotate(f"#{i}", xy, textcoords="offset points", xytext=(x - px, y - py),
                    fontsize=8, arrowprops={"arrowstyle": "-", "lw": 0.4, "color": "#1f77b4"}
                    if tied else None)


def plot_path(path: str) -> Path:
    """The file the plot goes to (checked before the search runs)."""
    p = Path(path)
    if p.suffix.lower() not in (".png", ".svg", ".pdf"):
        if p.suffix:
            raise InputError(f"--plot {path!r}: expected a .png, .svg or .pdf file name")
        p = p.with_suffix(".png")
    if p.parent and not p.parent.exists():
        raise InputError(f"--plot {path!r}: directory {str(p.parent)!r} does not exist")
    return p


def save_pareto(res: dict, path: str) -> str:
    """Write the figure (format from the extension: png, svg or pdf; png if none)."""
    from .figures import save_as  # deferred: loaded when the command runs (start-up)

    p = plot_path(path)
    return str(save_as(pareto_figure(res), p))
