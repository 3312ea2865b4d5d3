"""`surge model profile STORE`: take (or show) the engine step profile BlitzScale's monitor uses.

BlitzScale §5.3 derives the load monitor's per-instance bounds "by profiling the average
serving load per-instance offline". `surge serve` takes that profile itself when it deploys a
model whose monitor asks (`control/emulation.deployment_profile`); this command takes it
ahead of time, e.g. on a quiet machine or after an upgrade (`--remeasure`), with the engine
settings `surge serve` gives its agents (on a CPU, the threads each of its `--nodes` local
agents computes on: this machine's cores shared out), and prints the bounds it gives at the
default SLO. Kept where `surge serve` looks (`runtime/step_profiles.py`).
"""

from pathlib import Path
from typing import Annotated

import typer

from surge.config import compile_decode_default
from surge.control.settings import ControllerConfig


def profile(
    store_dir: Annotated[Path, typer.Argument(help="A store made by `surge model import`.")],
    max_num_seqs: Annotated[
        int, typer.Option(help="Sequences one engine runs at once (serve's max_num_seqs).")
    ] = ControllerConfig.max_num_seqs,
    compile_decode: Annotated[
        bool | None,
        typer.Option(help="Compiled decode steps, as serve's compile_decode (default: on)."),
    ] = None,
    fuse_projections: Annotated[
        bool, typer.Option(help="Fused q/k/v and gate/up, as serve's fuse_projections.")
    ] = ControllerConfig.fuse_projections,
    nodes: Annotated[
        int,
        typer.Option(help="Local agents serve starts (serve's --nodes): each one's CPU threads."),
    ] = ControllerConfig.nodes,
    profile_dir: Annotated[
        Path | None, typer.Option(help="Where profiles are kept (default $SURGE_HOME/profiles).")
    ] = None,
    remeasure: Annotated[
        bool, typer.Option(help="Measure again even if a profile is kept.")
    ] = False,
) -> None:
    """Profile STORE's engine on this machine's device (seconds, once per model, device and
    engine settings) and print the load monitor's bounds it gives (BlitzScale §5.3)."""
    from surge.config import EngineConfig
    from surge.model.manifest import read_manifest
    from surge.policy.blitzscale.monitor import bounds, profile_costs
    from surge.policy.slo import Slo
    from surge.runtime.launch.agent_process import local_agent_threads
    from surge.runtime.step_profiles import default_profile_dir, ensure_profile

    manifest = read_manifest(store_dir)
    engine = EngineConfig(
        max_num_seqs=max_num_seqs,
        fuse_projections=fuse_projections,
        compile_decode=compile_decode_default() if compile_decode is None else compile_decode,
    ).validate()
    directory = profile_dir.expanduser().resolve() if profile_dir else default_profile_dir()
    if nodes < 1:
        raise typer.BadParameter(f"--nodes must be >= 1 (got {nodes})")
    import torch

    torch.set_num_threads(local_agent_threads(nodes))  # as serve's agents: a CPU step's time
    progress = lambda line: typer.echo(line, err=True)  # noqa: E731
    steps = ensure_profile(manifest, engine, directory, progress, remeasure, must_save=True)
    for n, s in steps.prefill_s:
        typer.echo(f"prefill {n:5d} tokens: {s * 1e3:9.2f} ms")
    for b, s in steps.decode_s:
        typer.echo(f"decode batch {b:4d}: {s * 1e3:9.2f} ms/step")
    slo = Slo()
    b = bounds(profile_costs(steps, engine.max_prefill_tokens, engine.max_num_seqs), slo)
    typer.echo(
        f"monitor bounds at TTFT {slo.ttft_s:g} s / TBT {slo.tpot_s:g} s: prefill "
        f"{b.prefill_tokens_per_s:.0f} prompt tokens/s, decode {b.decode_tokens_per_s:.0f} "
        f"tokens/s (batch {b.decode_batch}); kept in {directory}"
    )
