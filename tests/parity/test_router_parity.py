"""Routing parity: fed the same endpoints (loads, limits, speeds, age) and the same requests,
`surge serve`'s `Server` and the simulator's request path send every request to the same
endpoint — both through `surge.policy.router.route`."""

import asyncio

import pytest

from surge.engine.sampling import SamplingParams
from surge.policy.systems import system_config
from surge.runtime.endpoints import Endpoint
from surge.runtime.request import ServeRequest
from surge.runtime.server import Server
from surge.sim.events import EventLoop
from surge.sim.pools import Pool, Requests
from surge.sim.request import SimRequest
from tests.parity.conftest import EndpointSpec, FakeClient

# Names sort differently from the order the endpoints came up, so a body that breaks ties
# by name instead of by age would differ.
SCENARIOS = {
    "ties go to the oldest": [
        EndpointSpec("m-node2", 1, 8),
        EndpointSpec("m-node10", 1, 8),
        EndpointSpec("m-node1", 1, 8),
    ],
    "speed-weighted, full ones skipped": [
        EndpointSpec("m-node3", 0, 4, 1.0),
        EndpointSpec("m-pipe-a-0", 0, 8, 0.25),
        EndpointSpec("m-node1", 3, 3, 1.0),
        EndpointSpec("m-node0", 2, 6, 0.5),
    ],
    "all full then none": [EndpointSpec("m-node5", 2, 2), EndpointSpec("m-node4", 1, 2)],
    # FlexPipe's `pack` rule: the busiest under its target first, then the least loaded
    "pack: busiest under target, then spread": [
        EndpointSpec("m-pipe-b", 0, 16, 1.0, 4.0),
        EndpointSpec("m-pipe-a", 1, 16, 1.0, 4.0),
        EndpointSpec("m-pipe-c", 0, 16, 1.0, 8.0),
    ],
    # coarse pipelines first; past the targets, by throughput (stages) up to 1.5x target
    "pack: coarse first, then by stages, capped": [
        EndpointSpec("m-flex-b", 0, 64, 1.0, 4.0, num_stages=2),
        EndpointSpec("m-flex-a", 1, 64, 1.0, 2.0),
    ],
}
PACKED = {"pack: busiest under target, then spread", "pack: coarse first, then by stages, capped"}
NUM_REQUESTS = 12


class _RuntimeEndpoint(Endpoint):
    def __init__(self, spec: EndpointSpec) -> None:
        self.name, self.nodes, self.capacity, self.speed = spec.name, (), spec.capacity, spec.speed
        self.route_target, self.stages_busy = spec.target, spec.num_stages
        self.requests = {f"pre{i}": None for i in range(spec.outstanding)}  # type: ignore[misc]

    @property
    def num_stages(self) -> int:
        return self.stages_busy

    async def submit(self, req: ServeRequest) -> None:
        self.requests[req.req_id] = req

    async def take_back(self) -> list[ServeRequest]:
        return []


def _runtime_choices(specs: list[EndpointSpec], routing: str) -> list[str | None]:
    async def run() -> list[str | None]:
        server = Server(FakeClient(), "m", routing)  # type: ignore[arg-type]
        try:
            for spec in specs:
                await server.add_endpoint(_RuntimeEndpoint(spec))
            out: list[str | None] = []
            for i in range(NUM_REQUESTS):
                req = ServeRequest(f"r{i}", [1, 2], SamplingParams(max_tokens=1))
                await server.submit(req)
                out.append(req.endpoint)
            return out
        finally:
            await server.close()

    return asyncio.run(run())


class _SimEndpoint:
    """The fields of `sim.instance.Instance` that routing reads."""

    def __init__(self, iid: int, spec: EndpointSpec, log: dict[int, str]) -> None:
        self.id, self.name, self.serving, self.log = iid, spec.name, True, log
        self.max_batch, self.speed, self.reserved = spec.capacity, spec.speed, 0
        self.submitted, self.route_target = spec.outstanding, spec.target
        self.micro_batches = spec.num_stages

    @property
    def outstanding(self) -> int:
        return self.submitted

    def route_fields(self) -> tuple:
        """What `Instance.route_fields` reads off an instance's fields."""
        fields = (self.outstanding + self.reserved, self.max_batch, self.speed)
        return (*fields, self.route_target, self.micro_batches)

    def submit(self, req: SimRequest, start: bool = True) -> None:
        self.submitted += 1
        self.log[req.id] = self.name


class _World:
    def __init__(self, system: str) -> None:
        self.system = system_config(system)
        self.loop = EventLoop()


def _sim_choices(specs: list[EndpointSpec], system: str) -> list[str | None]:
    pool = Pool(0, 0, "both")
    # Ids in the order the endpoints came up, as the simulator's instance factory gives them.
    log: dict[int, str] = {}
    pool.instances = [_SimEndpoint(1000 + i, s, log) for i, s in enumerate(specs)]  # type: ignore[list-item]
    requests = Requests(_World(system), {pool.key: pool}, lambda p: None, lambda p: None)  # type: ignore[arg-type]
    out: list[str | None] = []
    for i in range(NUM_REQUESTS):
        req = SimRequest(i, 0, 0.0, 2, 1)
        requests.dispatch(pool, req)
        out.append(log.get(i))
    return out


@pytest.mark.parametrize("name", SCENARIOS)
def test_both_bodies_route_alike(name: str) -> None:
    specs = SCENARIOS[name]
    system = "flexpipe" if name in PACKED else "lambdascale"
    runtime = _runtime_choices(specs, system_config(system).routing)
    sim = _sim_choices(specs, system)
    assert runtime == sim, name
    assert any(c is not None for c in runtime)
    if name == "ties go to the oldest":
        assert runtime[:3] == ["m-node2", "m-node10", "m-node1"]
    if name == "pack: busiest under target, then spread":
        # a fills to its target (4) first, then b (older than c at 0)
        assert runtime[:7] == ["m-pipe-a"] * 3 + ["m-pipe-b"] * 4
        assert set(runtime[7:]) == {"m-pipe-c"}
    if name == "pack: coarse first, then by stages, capped":
        # the one-stage a to its target (2), then b to its (4); past them b takes twice
        # a's share, none past 1.5x its target (a 3, b 6); the rest wait at the router
        assert runtime[:5] == ["m-flex-a"] + ["m-flex-b"] * 4
        assert runtime.count("m-flex-a") == 2 and runtime.count("m-flex-b") == 6
        assert runtime[8:] == [None] * 4
