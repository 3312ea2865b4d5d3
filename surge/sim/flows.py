"""Transfers as flows on shared links.

In: links (name -> capacity in Gb/s) and flows (a byte count over a path of links).
Out: a completion callback per flow at the virtual time its bytes have moved.

Sharing rule: every link splits its capacity equally among the flows crossing it, and a
flow runs at the smallest share on its path (per-link fair share). Whenever a flow
starts or ends, the flows that share a link with it are settled (bytes moved so far at
their old rate) and rescheduled at their new rate, so concurrent scale-outs, KV-cache
transfers and loads from host or SSD slow one another down where they meet (the
contention ParaServe §4.2 places around and BlitzScale §5.1 prunes for).
"""

from collections.abc import Callable

from surge.errors import SurgeError
from surge.policy.multicast.timing import BITS_PER_BYTE, BITS_PER_GBIT
from surge.sim.events import Event, EventLoop, Priority


class Link:
    """A shared resource with a capacity."""

    __slots__ = ("bytes_per_s", "flows", "name", "speed")

    def __init__(self, name: str, gbps: float) -> None:
        if not gbps > 0:
            raise SurgeError(f"link {name} needs a capacity > 0 Gb/s (got {gbps})")
        self.name = name
        self.bytes_per_s = gbps * BITS_PER_GBIT / BITS_PER_BYTE
        self.flows: set[Flow] = set()
        self.speed = 1.0
        """Fraction of its capacity the hosts' CPUs let it move now (< 1: the agent at
        this end is CPU-bound: a host model's, `sim/host.py`)."""


class Flow:
    """Bytes moving over a path of links."""

    __slots__ = ("bytes_left", "event", "id", "last_s", "links", "on_done", "rate", "size")

    def __init__(self, fid: int, links: tuple[Link, ...], size: float, on_done) -> None:
        self.id = fid
        self.links = links
        self.size = size
        self.bytes_left = size
        self.rate = 0.0
        self.last_s = 0.0
        self.on_done: Callable[[], None] = on_done
        self.event: Event | None = None

    def __hash__(self) -> int:
        return self.id

    def __eq__(self, other: object) -> bool:
        return self is other


class FlowNetwork:
    """Active flows and their rates on the event loop."""

    def __init__(self, loop: EventLoop, fixed_latency_s: float = 0.0) -> None:
        self.loop = loop
        self.fixed_latency_s = fixed_latency_s
        """Delay before every flow starts moving bytes (setup and completion cost)."""
        self.links: dict[str, Link] = {}
        self._ids = 0
        self.bytes_moved = 0.0
        """Bytes of finished flows."""
        self.speed = 1.0
        """Fraction of its fair share every flow moves at (< 1: the hosts' CPUs, not the
        links, limit transfers: a host model's, `sim/host.py`)."""

    def set_speed(self, speed: float) -> None:
        """Change the speed of every flow, those in flight included."""
        if speed == self.speed:
            return
        self.speed = speed
        active = {f for link in self.links.values() for f in link.flows}
        if active:
            self._reschedule(active)

    def set_link_speeds(self, speeds: dict[Link, float]) -> None:
        """Change the speed of the links in `speeds`, their flows in flight included."""
        changed = [link for link, v in speeds.items() if link.speed != v]
        for link in changed:
            link.speed = speeds[link]
        active = {f for link in changed for f in link.flows}
        if active:
            self._reschedule(active)

    def add_link(self, name: str, gbps: float) -> Link:
        """Create (or return the existing) link `name`."""
        if name not in self.links:
            self.links[name] = Link(name, gbps)
        return self.links[name]

    def start(self, path: tuple[Link, ...], size_bytes: float, on_done: Callable[[], None]) -> Flow:
        """Start moving `size_bytes` over `path`; `on_done()` runs when they arrive."""
        self._ids += 1
        flow = Flow(self._ids, path, float(size_bytes), on_done)
        if not path or size_bytes <= 0:
            self.loop.schedule(
                self.loop.now_s + self.fixed_latency_s, Priority.FLOW, flow.id, on_done
            )
            return flow
        if self.fixed_latency_s > 0:
            self.loop.schedule(
                self.loop.now_s + self.fixed_latency_s,
                Priority.FLOW,
                flow.id,
                lambda: self._begin(flow),
            )
        else:
            self._begin(flow)
        return flow

    def _begin(self, flow: Flow) -> None:
        flow.last_s = self.loop.now_s
        affected = self._neighbours(flow)
        for link in flow.links:
            link.flows.add(flow)
        self._reschedule(affected | {flow})

    def _neighbours(self, flow: Flow) -> set[Flow]:
        out: set[Flow] = set()
        for link in flow.links:
            out |= link.flows
        out.discard(flow)
        return out

    def _reschedule(self, flows: set[Flow]) -> None:
        now = self.loop.now_s
        for f in sorted(flows, key=lambda f: f.id):
            f.bytes_left -= f.rate * (now - f.last_s)
            f.last_s = now
            f.rate = self.speed * min(
                link.speed * link.bytes_per_s / len(link.flows) for link in f.links
            )
            if f.event is not None:
                f.event.cancel()
            delay = max(f.bytes_left, 0.0) / f.rate
            f.event = self.loop.schedule(now + delay, Priority.FLOW, f.id, self._finisher(f))

    def _finisher(self, flow: Flow) -> Callable[[], None]:
        def finish() -> None:
            for link in flow.links:
                link.flows.discard(flow)
            flow.bytes_left = 0.0
            self.bytes_moved += flow.size
            affected = self._neighbours(flow)
            if affected:
                self._reschedule(affected)
            flow.on_done()

        return finish

    @property
    def num_active(self) -> int:
        """Flows in progress."""
        return len({f for link in self.links.values() for f in link.flows})
