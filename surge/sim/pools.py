"""Pools and the request path: arrival, dispatch through the router, requeue, P/D hand-off.

In: requests arriving (`arrive`), endpoints finishing requests (`on_done`) or prefills
(`on_prefilled`, P/D disaggregation), and endpoints retiring (`requeue`). Out: requests
submitted to endpoints chosen by `surge.policy.router.route`, queued when none has room,
and two signals to the autoscaler passed in: `on_demand(pool)` (a request arrived or
queued: check at the next decision tick) and `on_idle(pool)` (an endpoint emptied: check
after the downscale delay).

A pool is one model in one role (`both`, or `prefill` / `decode` under P/D): its
instances, its open execution pipelines (λScale §4.3) and its queue. Under P/D a
prefilled request moves to the decode pool with its KV cache over the network
(BlitzScale §6).
"""

from collections import deque
from collections.abc import Callable

from surge.policy.autoscale import AutoscaleState
from surge.policy.router import Endpoint, route
from surge.sim.instance import Instance
from surge.sim.request import SimRequest
from surge.sim.world import World


class Pool:
    """Instances of one model in one role, and the requests waiting for them."""

    def __init__(self, index: int, model: int, role: str) -> None:
        self.index = index
        self.model = model
        self.role = role
        self.instances: list[Instance] = []
        """Instances (and ParaServe groups) the autoscaler counts."""
        self.pipelines: list[Instance] = []
        """Open execution pipelines (endpoints over loading instances)."""
        self.queue: deque[SimRequest] = deque()
        """Requests no endpoint had room for, oldest first."""
        self.autoscale_state = AutoscaleState()
        """The autoscaler's memory (`surge.policy.autoscale`)."""
        self.arrivals_s: deque[float] = deque()
        """Recent arrival times (ParaServe §6.1 predictor's sliding window)."""

    @property
    def key(self) -> tuple[int, str]:
        """(model, role)."""
        return (self.model, self.role)

    def endpoints(self) -> list[Instance]:
        """What the router may choose: serving instances, then open pipelines."""
        return [i for i in self.instances if i.serving] + self.pipelines


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
        """The pool a new request enters (prefill under P/D)."""
        role = "prefill" if self.world.system.pd_disaggregation else "both"
        return self.pools[(req.model, role)]

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

    def dispatch(self, pool: Pool, req: SimRequest) -> bool:
        """Send `req` to an endpoint of `pool` the router picks; False if none has room."""
        eps = pool.endpoints()
        if not eps:
            return False
        chosen = route(
            [
                Endpoint(
                    e.id,
                    e.outstanding + e.reserved,
                    e.max_batch,
                    e.speed,
                    e.route_target,
                    e.micro_batches,
                )
                for e in eps
            ],
            self.world.system.routing,
        )
        if chosen is None:
            return False
        inst = eps[0] if eps[0].id == chosen else next(e for e in eps if e.id == chosen)
        if pool.role == "decode" and req.kv_gpu >= 0:
            self._send_kv(pool, req, inst)
        else:
            inst.submit(req)
        return True

    def drain(self, pool: Pool) -> None:
        """Dispatch queued requests while endpoints have room."""
        while pool.queue:
            if not self.dispatch(pool, pool.queue[0]):
                return
            pool.queue.popleft()

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
        """A prefill instance finished `req`'s prefill: it moves to the decode pool."""
        req.kv_gpu = inst.gpus[0]
        decode = self.pools[(req.model, "decode")]
        if not self.dispatch(decode, req):
            decode.queue.append(req)
        self.on_demand(decode)
        self._freed(inst)

    def _freed(self, inst: Instance) -> None:
        pool = self.pools[inst.pool_key]
        self.drain(pool)
        if inst.outstanding == 0 and not pool.queue:
            self.on_idle(pool)

    def _send_kv(self, pool: Pool, req: SimRequest, inst: Instance) -> None:
        """Move a prefilled request's KV cache to decode instance `inst` (BlitzScale §6)."""
        inst.reserved += 1
        prof = self.world.models[req.model].profile
        path = self.world.state.gpu_to_gpu(req.kv_gpu, inst.gpus[0])

        def arrived() -> None:
            inst.reserved -= 1
            req.kv_gpu = -1
            if inst.released:
                self.requeue(pool, [req])
            else:
                inst.submit(req)

        self.world.net.start(path, prof.kv_bytes_per_token * req.input_tokens, arrived)
