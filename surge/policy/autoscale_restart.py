"""What a pool's autoscaler carries over a controller restart, and how the resumed pool
holds it.

A restart of `surge serve`'s controller (a crash, an upgrade) must not change scaling
decisions. What the decisions depend on that outlives the old controller:
- the historical peak: FlexPipe's always-ready floor is 30% of it (§9.1, §9.6 "30% of
  historical peak capacity"); a restart that dropped it dropped the floor until the pool
  served again;
- since when the pool has had no request in flight (`quiet_since_s`): the peak lapses
  `forget_peak_after_idle_s` after it and the last instance goes `keep_alive_s` after it, so a
  deployment that has idled 14 of its 15 minutes goes to zero 1 minute after a restart, not 15;
- how many instances it held (`held_instances`): those a new controller adopts
  (`policy.adoption`) count, the rest the resumed pool starts again, and all are held as its
  own would have been held (`policy.autoscale.decide`'s release rule, below);
- since when each instance has had no request (`instances`, by instance id: the node): an
  adopted instance gets its own time back (`policy.adoption.adopted_idle_since_s`), and the
  held instances are released as `decide` would have released them, each `downscale_delay_s`
  after its own last request, the longest-idle first, the last `keep_alive_s` after its own;
  a held instance with no time of its own (still loading when the carry was taken; a
  version-1 state file, which holds one time per pool) counts as quiet since the pool's time.
A request ends the carry: from then on the pool's own instances say.
Not carried: the stable and panic windows and the load monitor's rates measure requests in
flight, and those end with the old controller; a resumed pool has none, the state those
windows have before any load. A pool busy when its carry was taken counts as quiet since
then, and so does each of its busy instances (their requests ended with the controller; the
controller takes the carry at least every second while a pool is busy, and at its stop); its
idle instances keep their own times.
Pure: no clock and no file; `control/autoscale_memory.py` keeps the carry in the state
directory (wall-clock times, JSON) and puts it into the restored deployments.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass

from surge.errors import SurgeError


@dataclass(frozen=True)
class Restart:
    """A restart's carry in a resumed pool's `AutoscaleState` (`policy.autoscale.decide` reads
    it until a request comes). Times are the controller's clock's."""

    quiet_since_s: float
    """No request has been in flight since then (the old controller's last word)."""
    held_instances: int = 0
    """Instances the pool held then (loading or serving)."""
    instances: tuple[tuple[int, float], ...] = ()
    """(instance id, since when it has had no request) of the held instances known one by
    one, by id; the others count as quiet since `quiet_since_s`."""

    def __post_init__(self) -> None:
        if not math.isfinite(self.quiet_since_s):
            raise SurgeError(f"quiet_since_s must be finite (got {self.quiet_since_s})")
        if self.held_instances < 0:
            raise SurgeError(f"held_instances must be >= 0 (got {self.held_instances})")
        if len(self.instances) > self.held_instances:
            raise SurgeError(
                f"{len(self.instances)} instance times for {self.held_instances} held instances"
            )
        if any(not math.isfinite(t) for _, t in self.instances):
            raise SurgeError(f"instance times must be finite (got {self.instances})")

    def quiet_of(self, instance_id: int) -> float:
        """Since when this instance has had no request (the pool's time if the carry does
        not know it by id)."""
        return dict(self.instances).get(instance_id, self.quiet_since_s)

    def quiet_for(self, instance_ids: Iterable[int]) -> dict[int, float]:
        """Since when each of the resumed pool's instances counts as quiet: one the carry
        knows by id (adopted, or started again on its node) its own time; the others, by
        id, the carried times no present instance took, the longest-idle first, then the
        pool's time: so `decide` releases them when `hold` lets it."""
        known = dict(self.instances)
        ids = sorted(set(instance_ids))
        unknown = self.held_instances - len(self.instances)
        spare = iter(
            sorted([t for i, t in self.instances if i not in ids] + [self.quiet_since_s] * unknown)
        )
        return {i: known[i] if i in known else next(spare, self.quiet_since_s) for i in ids}

    def hold(
        self,
        now_s: float,
        downscale_delay_s: float,
        keep_alive_s: float,
        max_replicas: int | None = None,
    ) -> tuple[int, float | None]:
        """Instances the pool would still hold now had the controller not restarted (at most
        `max_replicas`, the most recently used kept), and when that number next falls (None:
        it is 0). As `decide` releases idle instances: the longest-idle first, each above the
        last `downscale_delay_s` after its own last request, the last `keep_alive_s` after
        its own, once every other has gone."""
        unknown = self.held_instances - len(self.instances)
        times = sorted([t for _, t in self.instances] + [self.quiet_since_s] * unknown)
        if max_replicas is not None:
            times = times[max(0, len(times) - max_replicas) :]
        if not times:
            return 0, None
        gone = [t + downscale_delay_s for t in times[:-1]]
        # the last of several goes once the others have (decide's release loop)
        gone.append(max([times[-1] + keep_alive_s, *gone[-1:]]))
        left = [g for g in gone if now_s < g]
        return (len(left), min(left)) if left else (0, None)


@dataclass(frozen=True)
class Carried:
    """What of one pool a restart now would carry (the state file's record; times are the
    controller's clock's, the file holds them as wall-clock)."""

    peak_instances: int
    """The historical peak (`AutoscaleState.peak_instances`)."""
    restart: Restart
    """Its quiet time and the instances it held."""

    def __post_init__(self) -> None:
        if self.peak_instances < 0:
            raise SurgeError(f"peak_instances must be >= 0 (got {self.peak_instances})")


def carry(
    peak_instances: int,
    restart: Restart | None,
    busy: bool,
    idle_since_s: float | None,
    instances: int,
    now_s: float,
    last: Carried | None = None,
    quiet: tuple[tuple[int, float], ...] = (),
) -> Carried | None:
    """What a restart at `now_s` would carry of a pool (module docstring): its peak, the
    instances it holds (or the `restart` it resumed from still holds for it), since when
    each has been quiet (`quiet`, `policy.autoscale.instances_quiet`; a resumed pool's
    `restart` keeps its own), and since when the pool has been: now if it is busy (its
    requests end with the controller); else the resumed `restart`'s time (no request
    since); else its instances' (`idle_since_s`, `policy.autoscale.idle_since`); else, at
    zero, the `last` carry's; else now. None when there is nothing to carry (no peak, no
    instance)."""
    held = instances
    if busy:
        quiet_s = now_s
    elif restart is not None:
        quiet_s, held = restart.quiet_since_s, max(instances, restart.held_instances)
        quiet = restart.instances
    elif idle_since_s is not None:
        quiet_s = idle_since_s
    else:
        quiet_s = now_s if last is None else last.restart.quiet_since_s
    if peak_instances == 0 and held == 0:
        return None
    return Carried(peak_instances, Restart(quiet_s, held, quiet))
