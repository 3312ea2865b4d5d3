"""Pools and the request path: arrival, dispatch through the router, requeue, P/D hand-off.

In: requests arriving (`arrive`), endpoints finishing requests (`on_done`) or prefills
(`on_prefilled`, P/D disaggregation), and endpoints retiring (`requeue`). Out: requests
submitted to endpoints chosen by `surge.policy.router.route`, queued when none has room,
and two signals to the autoscaler passed in: `on_demand(pool)` (a request arrived or
queued: check at the next decision tick) and `on_idle(pool)` (an endpoint emptied: check
after the downscale delay).

A pool is one model: its instances, its open execution pipelines (λScale §4.3) and its
queue. Under P/D disaggregation (BlitzScale §6) its `PdPool` (`sim/pd.py`) holds the
instances' roles and says which endpoints take new requests and which instance decodes a
prefilled request; the request's KV cache then moves there over the network.
"""

from collections import deque
from collections.abc import Callable
from operator import methodcaller

from surge.policy.autoscale import AutoscaleState, InstanceLoad
from surge.policy.router import Endpoint, route
from surge.sim.held import RouterQueue
from surge.sim.instance import Instance
from surge.sim.load_views import Snapshots
from surge.sim.pd import PdPool
from surge.sim.request import SimRequest
from surge.sim.world import World

ROUTE_FIELDS = methodcaller("route_fields")
"""An endpoint's router fields (`Instance.route_fields`), read in C."""


class Pool:
    """Instances of one model in one role, and the requests waiting for them."""

    def __init__(self, index: int, model: int, role: str, pd: PdPool | None = None) -> None:
        self.index = index
        self.model = model
        self.role = role
        self.pd = pd
        """Roles and hand-offs under P/D disaggregation (None: every instance serves whole
        requests)."""
        self.instances: list[Instance] = []
        """Instances (and ParaServe groups) the autoscaler counts."""
        self.pipelines: list[Instance] = []
        """Open execution pipelines (endpoints over loading instances)."""
        self.queue = RouterQueue()
        """Requests no endpoint had room for, oldest first (their prompt tokens without a
        first token kept as they come and go, `sim/held.py`)."""
        self.autoscale_state = AutoscaleState()
        """The autoscaler's memory (`surge.policy.autoscale`)."""
        self.arrivals_s: deque[float] = deque()
        """Recent arrival times (ParaServe §6.1 predictor's sliding window)."""
        self.route_views: Snapshots[Endpoint] = Snapshots(Endpoint)
        """The router's snapshots of its endpoints (`sim/load_views.py`)."""
        self.load_views: Snapshots[InstanceLoad] = Snapshots(InstanceLoad)
        """The autoscaler's snapshots of its instances (`sim/load_views.py`)."""

    @property
    def key(self) -> tuple[int, str]:
        """(model, role)."""
        return (self.model, self.role)

    def endpoints(self) -> list[Instance]:
        """What the router may choose: serving instances, then open pipelines (under P/D
        the ones `policy.blitzscale.pd.routable` names)."""
        eps = [i for i in self.instances if i.serving] + self.pipelines
        return eps if self.pd is None else self.pd.routable(eps, self.instances)

    def held(self, inst: Instance) -> int:
        """Requests `inst` holds: its engine's, K/V on its way to it, parked on it."""
        return inst.outstanding + inst.reserved if self.pd is None else self.pd.held(inst)


class Requests:
    """The request path of every pool."""

    def __init__(
        self,
        world: World,
        pools: dict[tuple[int, str], Pool],
        on_demand: Callable[[Pool], None],
        on_idle: Callable[[Pool], None],
    ) -> None:
        self.world = world
        self.pools = pools
        self.on_demand = on_demand
        self.on_idle = on_idle
        self.unfinished = 0
        """Requests not done yet."""
        self.window_s = world.system.predictor_window_s

    def entry_pool(self, req: SimRequest) -> Pool:
        """The pool a new request enters."""
        return self.pools[(req.model, "both")]

    def arrive(self, req: SimRequest) -> None:
        """A request arrives from the trace."""
        pool = self.entry_pool(req)
        now = self.world.loop.now_s
        pool.arrivals_s.append(now)
        while pool.arrivals_s[0] <= now - self.window_s:
            pool.arrivals_s.popleft()
        if self.dispatch(pool, req):
            self.world.result.hot_requests += 1
        else:
            pool.queue.append(req)
        self.on_demand(pool)

    def dispatch(self, pool: Pool, req: SimRequest, start: bool = True) -> Instance | None:
        """Send `req` to an endpoint of `pool` the router picks; None if none has room.
        `start` False: the endpoint waits for its `start` (more come at this instant)."""
        eps = pool.endpoints()
        if not eps:
            return None
        return self._send(req, eps, self._snapshot(pool, eps), start)

    def _snapshot(self, pool: Pool, eps: list[Instance]) -> list[Endpoint]:
        """The router's snapshots of `eps` now."""
        pool.route_views.prune(len(eps))
        if pool.pd is None:  # every endpoint at every routing decision: `Pool.held` inline
            return pool.route_views.each(eps, ROUTE_FIELDS)
        held = pool.pd.held
        return pool.route_views.each(
            eps, lambda e: (held(e), e.max_batch, e.speed, e.route_target, e.micro_batches)
        )

    def _send(
        self, req: SimRequest, eps: list[Instance], snapshot: list[Endpoint], start: bool
    ) -> Instance | None:
        """`req` to the endpoint `policy.router.route` picks from `snapshot` (of `eps`)."""
        chosen = route(snapshot, self.world.system.routing)
        if chosen is None:
            return None
        inst = eps[0] if eps[0].id == chosen else next(e for e in eps if e.id == chosen)
        if req.endpoint < 0:
            req.dispatched_s, req.endpoint = self.world.loop.now_s, inst.id
        inst.submit(req, start)
        return inst

    def drain(self, pool: Pool) -> None:
        """Hand parked requests off (P/D), then dispatch queued requests, while endpoints
        have room. The queued requests an endpoint takes start together (one prefill), as
        the runtime's server routes its queue in one pass before any engine steps."""
        if pool.pd is not None:
            self._hand_off(pool)
        took: dict[int, Instance] = {}
        eps: list[Instance] = []
        snapshot: list[Endpoint] = []
        while pool.queue:
            if not snapshot:
                eps = pool.endpoints()
                if not eps:
                    break
                snapshot = self._snapshot(pool, eps)
            inst = self._send(pool.queue[0], eps, snapshot, start=False)
            if inst is None:
                break
            pool.queue.popleft()
            took[inst.id] = inst
            if pool.pd is None:
                # Only `inst` changed since the snapshot (one more request waits on it,
                # nothing ran): its view is read again, the others' and the endpoints are
                # the same. Under P/D which endpoints are routable depends on the loads.
                snapshot[eps.index(inst)] = pool.route_views.get(inst.id, inst.route_fields())
            else:
                snapshot = []
        for inst in took.values():
            inst.start()

    def requeue(self, pool: Pool, reqs: list[SimRequest]) -> None:
        """Requests of a retired endpoint go back to the head of the queue."""
        for req in reversed(reqs):
            pool.queue.appendleft(req)
        self.drain(pool)

    def on_done(self, inst: Instance, req: SimRequest) -> None:
        """`inst` finished `req`."""
        self.unfinished -= 1
        self._freed(inst)

    def on_prefilled(self, inst: Instance, req: SimRequest) -> None:
        """A prefill instance finished `req`'s prefill: it parks there until the P/D
        policy names the instance that decodes it."""
        pool = self.pools[inst.pool_key]
        assert pool.pd is not None, "only a P/D pool has prefill instances"
        pool.pd.park(inst, req)
        self.on_demand(pool)
        self._freed(inst)

    def lost(self, pool: Pool, reqs: list[SimRequest]) -> None:
        """Prefilled requests whose K/V is gone (their instance left): prefilled again,
        prompt and generated tokens (as `surge serve` requeues them)."""
        for req in reqs:
            req.recompute = True
        if reqs:
            self.requeue(pool, reqs)

    def _freed(self, inst: Instance) -> None:
        pool = self.pools[inst.pool_key]
        self.drain(pool)
        if inst.outstanding == 0 and not pool.queue:
            self.on_idle(pool)

    def _hand_off(self, pool: Pool) -> None:
        """Parked requests, oldest first, to the instances `policy.blitzscale.pd`
        names while one has room (BlitzScale §6)."""
        assert pool.pd is not None
        while (handoff := pool.pd.next_handoff(pool.instances)) is not None:
            src, req, target = handoff
            if target is src:
                self.world.result.decoded_in_place.append(req.id)
                src.resume(req)  # its K/V is here: it decodes here
            else:
                self._send_kv(pool, req, src, target)

    def _send_kv(self, pool: Pool, req: SimRequest, src: Instance, inst: Instance) -> None:
        """Move a prefilled request's KV cache from `src` to decode instance `inst`."""
        inst.reserved += 1
        prof = self.world.models[req.model].profile
        path = self.world.state.gpu_to_gpu(src.gpus[0], inst.gpus[0])

        req.handoff_s = self.world.loop.now_s

        def arrived() -> None:
            inst.reserved -= 1
            req.kv_arrived_s = self.world.loop.now_s
            if inst.released:
                self.lost(pool, [req])
            else:
                req.kv_ready = True
                inst.submit(req)

        nbytes = prof.kv_bytes_per_token * req.input_tokens
        # the monitor's K/V ingress (BlitzScale §5.2): this hand-off's time alone on the
        # target's receiving link
        assert pool.pd is not None
        pool.pd.handed(inst, nbytes / path[-1].bytes_per_s)
        self.world.net.start(path, nbytes, arrived)
