"""Every plan of every strategy obeys the step model, delivers every block, is
deterministic, and no plan beats the timing model's lower bounds (issue 3)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from surge.policy.multicast.cluster import Cluster
from surge.policy.multicast.scale_out import (
    STRATEGIES,
    MulticastRequest,
    plan_multicast,
    plan_pipelines,
    plan_scale_out,
)
from tests.policy.replay import assert_pipelines_valid, replay

GBPS = st.sampled_from([25.0, 50.0, 100.0, 200.0, 400.0])


@st.composite
def requests(draw: st.DrawFn) -> MulticastRequest:
    num_nodes = draw(st.integers(2, 36))
    num_sources = draw(st.integers(1, min(num_nodes - 1, 5)))
    num_blocks = draw(st.integers(1, 20))
    strategy = draw(st.sampled_from(STRATEGIES))
    cluster = None
    if draw(st.booleans()):
        egress = tuple(draw(st.lists(GBPS, min_size=num_nodes, max_size=num_nodes)))
        ingress = tuple(draw(st.lists(GBPS, min_size=num_nodes, max_size=num_nodes)))
        cluster = Cluster(egress, ingress)
    return MulticastRequest(
        num_nodes=num_nodes,
        num_blocks=num_blocks,
        num_sources=num_sources,
        strategy=strategy,
        cluster=cluster,
        block_bytes=draw(st.integers(1_000, 10**9)),
        transfer_overhead_s=draw(st.sampled_from([0.0, 1e-5, 1e-3])),
    )


@settings(max_examples=150, deadline=None)
@given(requests())
def test_every_plan_obeys_the_step_model_and_delivers_everything(request: MulticastRequest) -> None:
    plan = plan_multicast(request)
    arrival = replay(plan)
    assert plan.complete_step == max(max(a.values()) for a in arrival)
    assert plan.strategy == request.strategy


@settings(max_examples=60, deadline=None)
@given(requests())
def test_plans_pipelines_and_timelines_are_deterministic(request: MulticastRequest) -> None:
    first, second = plan_scale_out(request), plan_scale_out(request)
    assert first == second


@settings(max_examples=100, deadline=None)
@given(requests())
def test_every_listed_pipeline_is_valid(request: MulticastRequest) -> None:
    plan = plan_multicast(request)
    assert_pipelines_valid(plan, plan_pipelines(plan))


@settings(max_examples=100, deadline=None)
@given(requests())
def test_no_plan_beats_the_lower_bounds(request: MulticastRequest) -> None:
    timeline = plan_scale_out(request).timeline
    assert timeline.optimal_s <= timeline.complete_s * (1 + 1e-9)
    assert timeline.optimal_first_pipeline_s <= timeline.first_pipeline_s * (1 + 1e-9)
    assert timeline.first_pipeline_s <= timeline.complete_s
