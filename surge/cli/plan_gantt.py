"""Gantt chart of a planned scale-out: node x time, block arrivals, pipelines.

In: a `MulticastOutcome` and a PNG path.
Out: the PNG. Each transfer is a bar on the receiving node's row from its start to its
end, coloured by block; a black tick marks when a node holds the whole model (mode
switch); each pipeline is a labelled bracket over its nodes' rows from when it is
ready until it dissolves. Drawing is the CLI's, not the policy's (`surge plan --png`);
matplotlib is imported lazily with the Agg backend.
"""

from pathlib import Path

import numpy as np

from surge.policy.multicast.scale_out import MulticastOutcome

_MAX_PIPELINE_LABELS = 40
_MAX_NODE_LABELS = 128
"""Past this many nodes the node axis gets plain number ticks, not one label per node."""


def write_gantt_png(outcome: MulticastOutcome, path: Path) -> None:
    """Draw `outcome` and save it to `path` as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    plan, timeline = outcome.plan, outcome.timeline
    cmap = plt.get_cmap("viridis", max(plan.num_blocks, 2))
    fig_height = 1.5 + 0.3 * plan.num_nodes
    fig, ax = plt.subplots(figsize=(11, min(fig_height, 40)))
    # One collection holds every bar: a patch per transfer takes minutes for large plans.
    timed = timeline.transfers
    start = np.array([t.start_s for t in timed])
    end = np.array([t.end_s for t in timed])
    row = np.array([t.transfer.dst for t in timed], dtype=float)
    corners = np.stack(
        [
            np.stack([start, row - 0.35], axis=1),
            np.stack([start, row + 0.35], axis=1),
            np.stack([end, row + 0.35], axis=1),
            np.stack([end, row - 0.35], axis=1),
        ],
        axis=1,
    )
    bars = PolyCollection(
        list(corners),
        facecolors=cmap([t.transfer.block for t in timed]),
        edgecolors="white",
        linewidths=0.3,
    )
    ax.add_collection(bars)
    ax.set_xlim(0, max(timeline.complete_s, timeline.optimal_s) * 1.02)
    ax.set_ylim(-0.6, plan.num_nodes - 0.4)
    destinations = range(plan.num_sources, plan.num_nodes)
    done = [max(timeline.arrival_s[node]) for node in destinations]
    ax.vlines(
        done,
        [node - 0.45 for node in destinations],
        [node + 0.45 for node in destinations],
        color="black",
        linewidth=2,
    )
    for number, p in enumerate(outcome.pipelines[:_MAX_PIPELINE_LABELS], start=1):
        nodes = p.nodes
        ready = max(
            timeline.arrival_s[s.node][k]
            for s in p.stages
            for k in range(s.first_block, s.last_block + 1)
        )
        until = min(max(timeline.arrival_s[n]) for n in nodes)
        for n in nodes:
            ax.plot([ready, until], [n + 0.42, n + 0.42], color="red", linewidth=1.2)
            ax.annotate(f"P{number}", (ready, n + 0.38), color="red", fontsize=7)
    ax.axvline(timeline.optimal_s, color="grey", linestyle="--", linewidth=1)
    if plan.num_nodes <= _MAX_NODE_LABELS:
        ax.set_yticks(range(plan.num_nodes))
        ax.set_yticklabels(
            [f"{n} (src)" if n < plan.num_sources else str(n) for n in range(plan.num_nodes)],
            fontsize=7,
        )
    ax.invert_yaxis()
    ax.set_xlabel(
        "seconds\nbars: block arrivals (row = receiver); black tick: node holds the model; "
        "red Pn: execution pipeline n, from ready to mode switch",
        fontsize=8,
    )
    ax.set_ylabel("node")
    ax.set_title(
        f"{plan.strategy}: N={plan.num_nodes} B={plan.num_blocks} K={plan.num_sources}  "
        f"complete {timeline.complete_s:.3f}s (optimum {timeline.optimal_s:.3f}s, dashed), "
        f"first pipeline {timeline.first_pipeline_s:.3f}s",
        fontsize=9,
    )
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(-0.5, plan.num_blocks - 0.5))
    ticks = range(0, plan.num_blocks, max(1, plan.num_blocks // 16))
    fig.colorbar(sm, ax=ax, label="block", ticks=list(ticks))

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
