"""`surge plan ...`: print and draw multicast plans from `surge.policy`.

In: command-line options. Out: a summary or the plan's JSON on stdout, optionally a
Gantt PNG. Bad values raise `SurgeError`, which the entry point prints as one line
with exit code 2. No torch here: `surge plan` must start fast.
"""

import json
import math
import time
from pathlib import Path
from typing import Annotated

import typer

from surge.cli.outputs import check_output_file
from surge.cli.plan_report import outcome_to_json
from surge.errors import SurgeError
from surge.policy.blitzscale.zigzag import ZigzagProblem, ZigzagSchedule, best_effort, solve_zigzag
from surge.policy.multicast.cluster import Cluster
from surge.policy.multicast.scale_out import (
    DEFAULT_GBPS,
    STRATEGIES,
    MulticastOutcome,
    MulticastRequest,
    check_planner_limits,
    plan_scale_out,
)

BYTES_PER_MB = 1_000_000
SECONDS_PER_US = 1e-6
MAX_BLOCK_MB = 1e6
"""A block of a terabyte is past any model's; more overflowed the planner's integer bytes
(`--block-mb 1e20`: an OverflowError traceback)."""
MAX_ZIGZAG_BATCHES = 1000
"""Most batches `surge plan zigzag` solves the ILP for: measured on the 2-core VM (80 layers),
250 batches 1.1 s, 500 2.4 s, 1,000 17 s (load 10), 3,000 not done in 120 s, silently. The
paper's batches are those run while one target loads: a handful (Fig. 12)."""

app = typer.Typer(
    help="Plan model multicasts and execution pipelines.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def plan() -> None:
    """Plan model multicasts and execution pipelines (pure policy, no model needed)."""


def _parse_cluster(
    num_nodes: int, bandwidth_gbps: float | None, bandwidths: str | None
) -> Cluster | None:
    """A cluster from --bandwidth-gbps or --bandwidths (not both), or None for defaults."""
    if bandwidth_gbps is not None and bandwidths is not None:
        raise SurgeError("give either --bandwidth-gbps or --bandwidths, not both")
    if bandwidths is not None:
        try:
            values = [float(v) for v in bandwidths.split(",")]
        except ValueError:
            values = [math.nan]
        if not all(math.isfinite(v) for v in values):
            raise SurgeError(
                f"--bandwidths must be comma-separated finite numbers in Gbit/s (got "
                f"{bandwidths!r})"
            )
        if len(values) != num_nodes:
            raise SurgeError(
                f"--bandwidths has {len(values)} values for {num_nodes} nodes; give one per node"
            )
        return Cluster.symmetric(values)
    if bandwidth_gbps is not None:
        if not (math.isfinite(bandwidth_gbps) and bandwidth_gbps > 0):  # inf: 0-s plans
            raise SurgeError(f"--bandwidth-gbps must be a finite number > 0 (got {bandwidth_gbps})")
        return Cluster.uniform(num_nodes, bandwidth_gbps)
    return None


def _summary(outcome: MulticastOutcome) -> str:
    plan, timeline = outcome.plan, outcome.timeline
    lines = [
        f"strategy {plan.strategy}: {plan.num_nodes} nodes, {plan.num_blocks} blocks, "
        f"{plan.num_sources} source(s)",
        f"complete at step {plan.complete_step}: {timeline.complete_s:.4f} s "
        f"(optimum {timeline.optimal_s:.4f} s, "
        f"ratio {timeline.complete_s / timeline.optimal_s:.3f})",
        f"first serving capacity: {timeline.first_pipeline_s:.4f} s",
        f"{len(outcome.pipelines)} execution pipeline(s):",
    ]
    for p in outcome.pipelines:
        stages = " | ".join(f"node {s.node}: {s.first_block}-{s.last_block}" for s in p.stages)
        lines.append(f"  from step {p.step} until step {p.until_step}: {stages}")
    return "\n".join(lines)


@app.command("multicast")
def multicast(
    nodes: Annotated[int, typer.Option("--nodes", help="N, nodes taking part (>= 2).")],
    blocks: Annotated[
        int | None, typer.Option("--blocks", help="B, blocks the model is split into (required).")
    ] = None,
    sources: Annotated[int, typer.Option("--sources", help="K, nodes 0..K-1 hold the model.")] = 1,
    strategy: Annotated[
        str, typer.Option("--strategy", help=f"One of: {', '.join(STRATEGIES)}.")
    ] = "binomial",
    bandwidth_gbps: Annotated[
        float | None,
        typer.Option(
            "--bandwidth-gbps", help=f"Every node's link, Gbit/s (default {DEFAULT_GBPS:g})."
        ),
    ] = None,
    bandwidths: Annotated[
        str | None,
        typer.Option("--bandwidths", help="Per-node links, Gbit/s, comma-separated (N values)."),
    ] = None,
    block_mb: Annotated[
        float, typer.Option("--block-mb", help="Size of one block, MB (1e6 bytes).")
    ] = 100.0,
    overhead_us: Annotated[
        float, typer.Option("--overhead-us", help="Fixed cost per transfer, microseconds.")
    ] = 0.0,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the plan as one JSON object.")
    ] = False,
    png: Annotated[
        Path | None, typer.Option("--png", help="Write a Gantt chart to this PNG.")
    ] = None,
) -> None:
    """Plan a multicast of a model to N nodes and the execution pipelines it allows."""
    check_output_file(png, "--png")
    if blocks is None:
        check_planner_limits(nodes, 1, 1)  # a scale-out too large to plan says so first
        raise SurgeError("give --blocks B, the number of blocks the model is split into")
    if not 0 < block_mb <= MAX_BLOCK_MB:  # NaN and inf fail too
        raise SurgeError(f"--block-mb must be > 0 and at most {MAX_BLOCK_MB:g} (got {block_mb})")
    if not (math.isfinite(overhead_us) and overhead_us >= 0):  # NaN printed NaN times
        raise SurgeError(f"--overhead-us must be a finite number >= 0 (got {overhead_us})")
    request = MulticastRequest(
        num_nodes=nodes,
        num_blocks=blocks,
        num_sources=sources,
        strategy=strategy,
        cluster=_parse_cluster(nodes, bandwidth_gbps, bandwidths),
        block_bytes=max(1, round(block_mb * BYTES_PER_MB)),
        transfer_overhead_s=overhead_us * SECONDS_PER_US,
    )
    outcome = plan_scale_out(request)
    if png is not None:
        from surge.cli.plan_gantt import write_gantt_png

        write_gantt_png(outcome, png)
    if as_json:
        typer.echo(json.dumps(outcome_to_json(outcome)))
    else:
        typer.echo(_summary(outcome))


def _zigzag_json(schedule: ZigzagSchedule) -> dict:
    return {
        "splits": [list(split) for split in schedule.splits],
        "avg_latency": schedule.avg_latency,
    }


@app.command("zigzag")
def zigzag(
    layers: Annotated[int, typer.Option("--layers", help="L, layers of the model (>= 1).")],
    load_ratio: Annotated[
        float,
        typer.Option(
            "--load-ratio", help="Time to load one layer / time to execute one layer (> 0)."
        ),
    ],
    batches: Annotated[
        int, typer.Option("--batches", help="N, equal batches run while the target loads.")
    ],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print both schedules as one JSON object.")
    ] = False,
) -> None:
    """BlitzScale zigzag (§5.2, Eq. 1): the ILP schedule and best-effort, side by side.

    Latencies are in units of one layer's execution time, as in the paper.
    """
    problem = ZigzagProblem(num_layers=layers, load_ratio=load_ratio, num_batches=batches)
    if batches > MAX_ZIGZAG_BATCHES:  # after the problem's own checks (batches >= 1, ...)
        raise SurgeError(
            f"--batches {batches:,} is over {MAX_ZIGZAG_BATCHES:,}, past which the ILP takes "
            "minutes to solve; plan fewer batches (BlitzScale's are those run while one "
            "target loads)"
        )
    started = time.perf_counter()
    ilp = solve_zigzag(problem)
    solve_ms = (time.perf_counter() - started) * 1000.0
    baseline = best_effort(problem)
    if as_json:
        out = {
            "layers": layers,
            "load_ratio": load_ratio,
            "batches": batches,
            "solve_ms": solve_ms,
            "schedules": {"zigzag": _zigzag_json(ilp), "best_effort": _zigzag_json(baseline)},
        }
        typer.echo(json.dumps(out))
        return
    lines = [f"{layers} layers, load ratio {load_ratio:g}, {batches} batches"]
    for name, schedule in (("zigzag (ILP)", ilp), ("best effort", baseline)):
        splits = " ".join(f"({t},{s})" for t, s in schedule.splits)
        lines.append(f"{name}: avg latency {schedule.avg_latency:.3f} layer-times: {splits}")
    lines.append(f"ILP solved in {solve_ms:.1f} ms")
    typer.echo("\n".join(lines))
