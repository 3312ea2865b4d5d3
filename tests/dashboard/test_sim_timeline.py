"""`surge simulate --timeline FILE`: the simulator writes the dashboard's event format (the
file `surge dashboard` replays): machines as nodes, the deployment's strategy and layers,
scale-outs, blocks landing, instances, pipelines whose stages tile the model, requests."""

import itertools
from collections import Counter

from surge.events import (
    BlockLanded,
    DeploymentUp,
    InstanceDrained,
    InstanceUp,
    NodesKnown,
    PipelineOpened,
    RequestDone,
    Timeline,
)
from tests.conftest import run_surge

TRACE = "gamma:rate=4,cv=4,duration=60"


def test_a_simulated_run_writes_a_replayable_timeline(tmp_path) -> None:
    path = tmp_path / "sim.json"
    r = run_surge(
        "simulate", "--system", "lambdascale", "--trace", TRACE,
        "--cluster", "lambdascale-testbed1", "--timeline", str(path),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    tl = Timeline.read(path)
    evs = tl.events
    assert [e.t_s for e in evs] == sorted(e.t_s for e in evs)
    kinds = Counter(type(e) for e in evs)
    (nodes,) = [e for e in evs if isinstance(e, NodesKnown)]
    (dep,) = [e for e in evs if isinstance(e, DeploymentUp)]
    assert dep.strategy == "lambdascale" and len(dep.block_layers) == dep.num_blocks
    assert kinds[InstanceUp] >= 1 and kinds[RequestDone] >= 100 and kinds[BlockLanded] >= 1
    assert all(e.node in nodes.nodes for e in evs if isinstance(e, InstanceUp | BlockLanded))
    up = Counter(e.node for e in evs if isinstance(e, InstanceUp))
    down = Counter(e.node for e in evs if isinstance(e, InstanceDrained))
    assert all(down[n] <= up[n] for n in down)  # drained only what came up
    for p in (e for e in evs if isinstance(e, PipelineOpened)):
        layers = [(a, b) for _, a, b in p.stages]
        assert layers[0][0] == 0 and layers[-1][1] == dep.num_layers
        assert all(x[1] == y[0] for x, y in itertools.pairwise(layers))


def test_timeline_needs_one_system(tmp_path) -> None:
    r = run_surge(
        "simulate", "--system", "lambdascale", "--system", "serverlessllm", "--trace", TRACE,
        "--timeline", str(tmp_path / "x.json"),
    )  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.strip() == "error: --timeline records one system: pass exactly one --system"
