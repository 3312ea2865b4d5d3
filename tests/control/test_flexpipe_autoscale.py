"""A FlexPipe deployment's autoscaler target follows its pipelines' parallelism: a pipeline
of η stages keeps η micro-batches (so η stages) busy, so it takes that many instances' worth
of requests before the autoscaler asks for another (FlexPipe §7 Eq. 12); other strategies
keep their target."""

import asyncio
from types import SimpleNamespace

from surge.config import EngineConfig
from surge.control.flexpipe import FlexPipeControl, flexpipe_autoscale
from surge.control.spec import DeploymentSpec
from surge.control.state import FlexPipeRecord
from surge.model.manifest import read_manifest
from surge.policy.autoscale_settings import AutoscaleSettings
from surge.policy.router import Endpoint, route
from surge.policy.systems import serve_system
from surge.runtime.migration.refactor import FlexPipeline
from surge.runtime.scaleout.flexpipe import micro_batches


def _dep(strategy: str, stage_counts: list[int], manifest) -> SimpleNamespace:
    pipes = {}
    for i, n in enumerate(stage_counts):
        stages = [(node, node, node + 1) for node in range(n)]
        micro, most = micro_batches(serve_system("flexpipe"), manifest, EngineConfig(), n)
        pipes[f"p{i}"] = FlexPipeline(
            None, manifest, "m", f"p{i}", stages, EngineConfig(), micro, most
        )
    return SimpleNamespace(
        spec=SimpleNamespace(strategy=strategy, system=serve_system(strategy)),
        server=SimpleNamespace(endpoints=pipes),
    )


def test_pipeline_target_scales_with_its_busy_stages(tiny_store) -> None:
    manifest = read_manifest(tiny_store)
    base = AutoscaleSettings(target_ongoing_requests=4.0)
    one = flexpipe_autoscale(_dep("flexpipe", [1], manifest), base)
    two = flexpipe_autoscale(_dep("flexpipe", [2, 2], manifest), base)
    three = flexpipe_autoscale(_dep("flexpipe", [3], manifest), base)
    assert one.target_ongoing_requests == 4.0
    assert two.target_ongoing_requests == 8.0
    # The head keeps one micro-batch per stage (§7 Eq. 12), as the simulator does.
    assert three.target_ongoing_requests == 12.0
    # No pipeline yet, or another strategy: the base target.
    assert flexpipe_autoscale(_dep("flexpipe", [], manifest), base) == base
    assert flexpipe_autoscale(_dep("lambdascale", [2], manifest), base) == base


def test_the_controller_sets_each_pipelines_pack_target(tiny_store) -> None:
    """Every tick the granularity loop sets what the `pack` router fills each pipeline up
    to: its busy stages times the deployment's instance target (the autoscaler's count)."""
    manifest = read_manifest(tiny_store)
    dep = _dep("flexpipe", [1, 2], manifest)
    dep.spec.autoscaling = AutoscaleSettings(target_ongoing_requests=4.0)
    dep.instances = {}
    dep.flexpipe = FlexPipeRecord(last_decision_s=100.0)  # no decision due: targets only
    control = FlexPipeControl(None, None, None, None, list, lambda n: 0)  # type: ignore[arg-type]
    asyncio.run(control.tick(dep, 100.5))  # type: ignore[arg-type]
    targets = [p.route_target for p in dep.server.endpoints.values()]
    assert targets == [4.0, 8.0]
    # the busier pipeline under its target takes the next request
    eps = [Endpoint(i, n, 64, 1.0, t) for i, (n, t) in enumerate(zip([1, 3], targets, strict=True))]
    assert route(eps, serve_system("flexpipe").routing) == 1
    assert route(eps, serve_system("lambdascale").routing) == 0


def test_the_loop_decides_at_the_deployments_own_interval(tiny_store) -> None:
    """A deployment's `flexpipe.decision_interval_s` (`DeploymentSpec.flexpipe`) is the
    interval the controller's granularity loop decides at, not the system's 1 s."""
    manifest = read_manifest(tiny_store)

    def decided(spec: DeploymentSpec) -> bool:
        dep = SimpleNamespace(
            name="m",
            spec=spec,
            manifest=manifest,
            instances={},
            server=SimpleNamespace(endpoints={}, arrivals=[], queue=[]),
            flexpipe=FlexPipeRecord(last_decision_s=100.0),
        )
        pool = SimpleNamespace(complete=lambda model, tier: [])
        control = FlexPipeControl(None, pool, None, None, list, lambda n: 0)  # type: ignore[arg-type]
        asyncio.run(control.tick(dep, 100.06))  # type: ignore[arg-type]
        return dep.flexpipe.last_decision_s == 100.06

    flex = {"name": "m", "model": "/m", "strategy": "flexpipe"}
    assert not decided(DeploymentSpec.from_json(flex))
    assert decided(DeploymentSpec.from_json(flex | {"flexpipe": {"decision_interval_s": 0.05}}))
