"""P/D disaggregation, the controller's part: attach it, run its monitor, carry out mutation.

What flows, every autoscaler tick, per deployment that runs P/D (its spec's `pd:`, or a
system with `pd_disaggregation`, e.g. blitzscale): the server's `PdServing`
(`runtime/migration/pd_handoff.py`) gives the monitor's view (`PdServing.load`: roles, requests,
tokens/s, KV use, K/V ingress per instance) -> `policy.blitzscale.pd_mutation.look`
(`decide_mutation` when the system mutates, then the per-role monitor) -> `PdServing.mutate`;
at a scale-out of a system that mutates, `on_scale_out` carries out
`policy.blitzscale.pd_mutation.scale_out_mutations` (§5.2: decode grows by mutation, the new
instances prefill); the monitor's wish for one more instance than the
concurrency target asks goes to the autoscaler (`policy.blitzscale.pd.with_monitor`). Hand-off and
mutation counts go to `/metrics` (`surge_pd_handoffs`, `surge_pd_mutations`,
`surge_pd_instances`). `egress_traffic` reports, for a multicast being planned, which
nodes' egress carries K/V (prefill instances, parked hand-offs): `policy.multicast.topology` prunes
those sources (BlitzScale §5.1). Called by `control/autoscaler.py`; decides nothing itself.
"""

import logging
from collections.abc import Iterable, Mapping

from surge.config import EngineConfig
from surge.control.emulation import kv_pace, monitor_kv_tokens
from surge.control.metrics import Metrics
from surge.control.state import Deployment
from surge.emulation import Emulation
from surge.events import NO_BUS, EventBus, Mutation
from surge.policy.blitzscale.pd import DECODE, PREFILL, PdTargets
from surge.policy.blitzscale.pd_mutation import Mutation as MutationChoice
from surge.policy.blitzscale.pd_mutation import look, scale_out_mutations
from surge.policy.multicast.topology import NodeLinks, NodeTraffic
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.migration.pd_handoff import PdServing

log = logging.getLogger(__name__)


def disaggregated(dep: Deployment) -> bool:
    """Whether `dep` serves prefill and decode on separate instances (P/D): its own `pd`
    targets, or its system's `pd_disaggregation`."""
    return dep.spec.pd is not None or dep.spec.system.pd_disaggregation


def egress_traffic(deployments: Iterable[Deployment]) -> dict[int, NodeTraffic]:
    """What each node's egress carries for P/D now, over every deployment: its prefill
    instances (each sends K/V out, BlitzScale §5.1) and the hand-offs parked on it or
    leaving it. The
    facts `policy.multicast.topology.busy_sources` prunes multicast sources by."""
    prefill: dict[int, int] = {}
    parked: dict[int, int] = {}
    for dep in deployments:
        pd = dep.server.pd
        if pd is None:
            continue
        for ep in dep.server.endpoints.values():
            if isinstance(ep, LocalEndpoint) and not ep.failed and pd.roles.get(ep.name) == PREFILL:
                prefill[ep.node] = prefill.get(ep.node, 0) + 1
        for node, n in pd.egress_handoffs().items():
            parked[node] = parked.get(node, 0) + n
    return {
        n: NodeTraffic(prefill.get(n, 0), parked.get(n, 0)) for n in sorted({*prefill, *parked})
    }


class PdControl:
    """The P/D monitor of every deployment that disaggregates."""

    def __init__(
        self,
        metrics: Metrics,
        engine: EngineConfig,
        events: EventBus = NO_BUS,
        links: Mapping[int, NodeLinks] | None = None,
        emulation: Emulation | None = None,
    ) -> None:
        self.metrics, self.engine, self.events = metrics, engine, events
        self.links: Mapping[int, NodeLinks] = links if links is not None else {}
        """Each agent's reported links (the controller's, kept current by it): the K/V
        ingress the monitor weighs (`PdServing.received`)."""
        self.emulation = emulation
        """GPU-time emulation: the K/V hand-offs are paced at its K/V byte ratio."""
        self._reported: dict[str, tuple[int, int]] = {}
        """Deployment -> (hand-offs, mutations) already counted in the metrics."""
        self._last_mutation_s: dict[str, float] = {}

    def attach(self, dep: Deployment) -> PdServing | None:
        """The deployment's `PdServing`, made on first sight (before its first instance)."""
        if dep.server.pd is not None:
            return dep.server.pd
        if not disaggregated(dep):
            return None
        system = dep.spec.system
        targets = dep.spec.pd or PdTargets()
        dep.server.pd = PdServing(
            dep.server,
            targets,
            monitor_kv_tokens(self.emulation, self.engine),
            mutation=system.mutation,
            links=self.links,
            kv_pace=kv_pace(self.emulation, dep.manifest),
            nodes=dep.instances.keys,  # its slots, loading or serving
        )
        return dep.server.pd

    async def tick(self, dep: Deployment, now_s: float) -> int:
        """One look at the deployment; returns the instances the monitor adds (0 or 1)."""
        pd = self.attach(dep)
        if pd is None:
            return 0
        pd.kick()  # a safety net: hand-offs that wait are retried every tick too
        system = dep.spec.system
        last_s = self._last_mutation_s.get(dep.name)
        load = pd.load(now_s, float("inf") if last_s is None else now_s - last_s)
        seen = look(load, system.pd, system.mutation)
        if seen.mutation is not None and await self._mutate(dep, pd, seen.mutation, now_s):
            load = pd.load(now_s, 0.0)
        self._count(dep, pd, load.instances)
        return seen.monitor.scale_out

    async def on_scale_out(self, dep: Deployment, now_s: float, added: int) -> int:
        """The autoscaler just started `added` instances of `dep`: the mutations
        `policy.blitzscale.pd_mutation.scale_out_mutations` names, carried out (a system that
        mutates only, §5.2). How many."""
        pd = dep.server.pd
        system = dep.spec.system
        if pd is None or not system.mutation or added < 1:
            return 0
        last_s = self._last_mutation_s.get(dep.name)
        load = pd.load(now_s, float("inf") if last_s is None else now_s - last_s)
        chosen = scale_out_mutations(load, pd.targets, added, system.pd)
        done = [await self._mutate(dep, pd, m, now_s) for m in chosen]
        return sum(done)

    def releasable(self, dep: Deployment, release: tuple[int, ...]) -> tuple[int, ...]:
        """Of the autoscaler's `release` (nodes) for `dep`, those to let go: under P/D the
        instances that stay keep a prefill and a decode one
        (`policy.blitzscale.pd_release.releasable`)."""
        pd = dep.server.pd
        return release if pd is None else pd.releasable(release)

    async def _mutate(
        self, dep: Deployment, pd: PdServing, m: MutationChoice, now_s: float
    ) -> bool:
        """Turn the prefill instance `m` names into a decode one; whether it did."""
        ep = pd.endpoint_at(m.index)
        if ep is None:
            return False
        log.info("%s: mutate %s (%s)", dep.name, ep.name, m.reason)
        try:
            await pd.mutate(ep)
        except Exception as e:  # its agent died: failover retires it
            log.warning("%s: mutation of %s failed: %s", dep.name, ep.name, e)
            return False
        self._last_mutation_s[dep.name] = now_s
        node = getattr(ep, "node", -1)
        self.events.publish(Mutation(model=dep.name, node=node, from_role=PREFILL, to_role=DECODE))
        return True

    def _count(self, dep: Deployment, pd: PdServing, instances: tuple) -> None:
        m, name = self.metrics, dep.name
        handoffs, mutations = self._reported.get(name, (0, 0))
        m.pd_handoffs.labels(name).inc(pd.num_handoffs - handoffs)
        m.pd_mutations.labels(name).inc(pd.num_mutations - mutations)
        self._reported[name] = (pd.num_handoffs, pd.num_mutations)
        for role in (PREFILL, DECODE):
            m.pd_instances.labels(name, role).set(sum(i.role == role for i in instances))

    def forget(self, name: str) -> None:
        self._reported.pop(name, None)
        self._last_mutation_s.pop(name, None)
