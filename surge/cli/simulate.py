"""`surge simulate`: run systems on a trace and cluster in virtual time, compare them.

In: command-line options (trace, cluster, models, systems, duration, rate scale, seed,
outputs), or a multi-model scenario (`surge.sim.scenario`) in place of trace, cluster
and models. Out: a rich comparison table on stdout; optionally the comparison JSON and a
PNG (GPUs over time per system above the request rate, TTFT CDFs). A progress bar runs
while it simulates. Bad inputs raise `SurgeError` (one-line error, exit 2).
"""

import json
import logging
import time
from pathlib import Path
from typing import Annotated

import typer

from surge.cli.outputs import check_output_file
from surge.errors import SurgeError
from surge.events import Recorder, RequestDone
from surge.policy.slo import Slo

log = logging.getLogger(__name__)


def simulate(
    trace: Annotated[
        str | None,
        typer.Option(
            help="azure-code, azure-conv, gamma:rate=R,cv=C,duration=D, "
            "servegen:NAME, alibaba-genai, or a CSV file (Azure, BurstGPT or arrival_s,"
            "input_tokens,output_tokens[,model]; a relative path is also looked up under "
            "--traces-dir) [default: azure-conv]"
        ),
    ] = None,
    cluster: Annotated[
        str | None,
        typer.Option(
            help="Cluster preset (e.g. lambdascale-testbed1) or JSON file "
            "[default: lambdascale-testbed1]"
        ),
    ] = None,
    scenario: Annotated[
        str | None,
        typer.Option(
            help="Multi-model scenario: a JSON file (models, sizes, cluster, trace mapping; "
            "docs/simulator.md) or a bundled one (lambdascale-multi, ...); replaces "
            "--trace/--cluster/--model"
        ),
    ] = None,
    model: Annotated[
        list[str] | None,
        typer.Option(help="Model name (repeat for several; NAME*N for N copies)"),
    ] = None,
    system: Annotated[
        list[str] | None, typer.Option(help="System to simulate (repeat to compare)")
    ] = None,
    duration_s: Annotated[
        float | None, typer.Option(help="Only the first X seconds of the (scaled) trace")
    ] = None,
    start_s: Annotated[float, typer.Option(help="Skip the trace's first S seconds")] = 0.0,
    rate_scale: Annotated[float, typer.Option(help="Multiply the request rate by F")] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed of every random choice")] = 0,
    slo_ttft_s: Annotated[float, typer.Option(help="TTFT SLO of every model")] = Slo.ttft_s,
    slo_tpot_s: Annotated[float, typer.Option(help="TPOT SLO of every model")] = Slo.tpot_s,
    warm: Annotated[int, typer.Option(help="Instances per model serving at t=0")] = 0,
    block_count: Annotated[
        str,
        typer.Option(
            help="Blocks per multicast: system (the system's num_blocks) or elbow "
            "(λScale §4.2 selective block size, chosen per scale-out size)"
        ),
    ] = "system",
    traces_dir: Annotated[Path | None, typer.Option(help="Directory of the shared traces")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the JSON here")] = None,
    png: Annotated[Path | None, typer.Option(help="Write the PNG here")] = None,
    timeline: Annotated[
        Path | None,
        typer.Option(
            help="Write the dashboard's timeline of the one --system here (replay it: "
            "surge dashboard FILE)"
        ),
    ] = None,
) -> None:
    """Simulate serverless LLM systems on a trace at cluster scale and compare them."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from surge.policy.systems import system_config
    from surge.sim.metrics import summarize
    from surge.sim.report import JSON_KEYS, comparison_json, draw_png
    from surge.sim.scenario import load_scenario
    from surge.sim.scenario_traffic import build_trace
    from surge.sim.settings import SimSettings, check_block_count
    from surge.sim.simulator import Simulation
    from surge.traces.resolve import load_trace
    from surge.traces.transform import scale_rate, time_slice

    for path, flag in ((json_out, "--json"), (png, "--png"), (timeline, "--timeline")):
        check_output_file(path, flag)
    check_block_count(block_count)
    if rate_scale <= 0:
        raise SurgeError(f"--rate-scale must be > 0 (got {rate_scale})")
    if duration_s is not None and duration_s <= 0:
        raise SurgeError(f"--duration-s must be > 0 (got {duration_s})")
    if start_s < 0:
        raise SurgeError(f"--start-s must be >= 0 (got {start_s})")
    slo = Slo(slo_ttft_s, slo_tpot_s)
    if scenario is not None:
        if trace is not None or cluster is not None or model:
            raise SurgeError("--scenario replaces --trace, --cluster and --model; drop them")
        scn = load_scenario(scenario)
        systems = system or list(scn.systems)
        loaded = build_trace(scn, traces_dir)
    else:
        scn = None
        systems = system or ["lambdascale", "serverlessllm"]
        loaded = load_trace(trace or "azure-conv", seed, traces_dir)
    for name in systems:
        system_config(name)
    if timeline is not None and len(systems) != 1:
        raise SurgeError("--timeline records one system: pass exactly one --system")
    recorder = Recorder() if timeline is not None else None
    loaded = time_slice(scale_rate(loaded, rate_scale), start_s, duration_s)
    if loaded.num_requests == 0:
        raise SurgeError("the trace has no requests in the chosen window")
    results, summaries = {}, {}
    wall = time.perf_counter()
    horizon = loaded.duration_s or 1.0
    with Progress(transient=True) as progress:
        for name in systems:
            if scn is not None:
                settings = scn.settings(name, block_count=block_count)
                sim = Simulation(loaded, settings, scn.system(name), timeline=recorder)
            else:
                settings = SimSettings(
                    cluster or "lambdascale-testbed1",
                    tuple(model or ["llama2-7b"]),
                    name,
                    seed,
                    slo,
                    warm_instances=warm,
                    block_count=block_count,
                )
                sim = Simulation(loaded, settings, timeline=recorder)
            task = progress.add_task(f"{name}", total=horizon)
            res = sim.run(lambda now, task=task: progress.update(task, completed=min(now, horizon)))
            progress.update(task, completed=horizon)
            results[name] = res
            summaries[name] = summarize(res, settings)
    wall_s = time.perf_counter() - wall
    where = scn.cluster.name if scn is not None else cluster or "lambdascale-testbed1"
    table = Table(title=f"{loaded.name} ({loaded.num_requests} requests) on {where}")
    cols = JSON_KEYS
    table.add_column("system")
    for c in cols:
        table.add_column(c, justify="right")
    for name, s in summaries.items():
        table.add_row(name, *[_fmt(s[c]) for c in cols])
    Console(width=170).print(table)
    if json_out is not None:
        json_out.write_text(json.dumps(comparison_json(summaries, wall_s), indent=2) + "\n")
    if png is not None:
        draw_png(results, png)
    if timeline is not None and recorder is not None:
        (res,) = results.values()
        add_requests(recorder, res)
        recorder.timeline(f"surge simulate --system {systems[0]} on {where}").write(timeline)


def add_requests(recorder: Recorder, res) -> None:
    """Each finished request as the dashboard's `request` event, at its completion."""
    import numpy as np

    done = np.flatnonzero(res.done_s >= 0)
    for i in done[np.argsort(res.done_s[done], kind="stable")]:
        first, n = float(res.first_token_s[i]), int(res.output_tokens[i])
        itl = (float(res.done_s[i]) - first) / (n - 1) if n > 1 else None
        recorder.publish(
            RequestDone(
                t_s=float(res.done_s[i]),
                model=res.model_names[int(res.model_index[i])],
                ttft_s=first - float(res.arrival_s[i]),
                itl_s=itl,
                num_tokens=n,
            )
        )
    recorder.events.sort(key=lambda e: e.t_s)


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)
