"""A FlexPipe deployment's autoscaler target follows its pipelines' parallelism: a pipeline
of η stages keeps min(η, micro-batches) of them busy, so it takes that many instances' worth
of requests before the autoscaler asks for another (FlexPipe §7 Eq. 12); other strategies
keep their target."""

from types import SimpleNamespace

from surge.control.flexpipe import flexpipe_autoscale
from surge.model.manifest import read_manifest
from surge.policy.autoscale import AutoscaleSettings
from surge.runtime.refactor import FlexPipeline


def _dep(strategy: str, stage_counts: list[int], manifest) -> SimpleNamespace:
    pipes = {}
    for i, n in enumerate(stage_counts):
        stages = [(node, node, node + 1) for node in range(n)]
        pipes[f"p{i}"] = FlexPipeline(None, manifest, "m", f"p{i}", stages)  # no I/O here
    return SimpleNamespace(
        spec=SimpleNamespace(strategy=strategy), server=SimpleNamespace(endpoints=pipes)
    )


def test_pipeline_target_scales_with_its_busy_stages(tiny_store) -> None:
    manifest = read_manifest(tiny_store)
    base = AutoscaleSettings(target_ongoing_requests=4.0)
    one = flexpipe_autoscale(_dep("flexpipe", [1], manifest), base)
    two = flexpipe_autoscale(_dep("flexpipe", [2, 2], manifest), base)
    three = flexpipe_autoscale(_dep("flexpipe", [3], manifest), base)
    assert one.target_ongoing_requests == 4.0
    assert two.target_ongoing_requests == 8.0
    # The head keeps 2 micro-batch groups: a third stage adds hops, not parallel requests.
    micro = FlexPipeline(None, manifest, "m", "x", [(0, 0, 1)]).num_micro_batches
    assert three.target_ongoing_requests == 4.0 * min(3, micro)
    # No pipeline yet, or another strategy: the base target.
    assert flexpipe_autoscale(_dep("flexpipe", [], manifest), base) == base
    assert flexpipe_autoscale(_dep("lambdascale", [2], manifest), base) == base
