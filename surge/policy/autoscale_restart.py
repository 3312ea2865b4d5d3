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
  own would have been held: every one until `downscale_delay_s` after the pool went quiet,
  the last until `keep_alive_s` after (`policy.autoscale.decide`'s release rule). A request
  ends the carry: from then on the pool's own instances say.
Not carried: the stable and panic windows and the load monitor's rates measure requests in
flight, and those end with the old controller; a resumed pool has none, the state those
windows have before any load. A pool busy when its carry was taken counts as quiet since
then (its requests ended with the controller; the controller takes the carry at least every
second while a pool is busy, and at its stop).
Deviation: the adopted or restarted instances are released `downscale_delay_s` after the
pool went quiet, not each after its own idle time (the carry is one time per pool): extra
instances may stay up to the spread of their idle times longer than without the restart; the
last one, and the peak's lapse, keep their times exactly.
Pure: no clock and no file; `control/autoscale_memory.py` keeps the carry in the state
directory (wall-clock times, JSON) and puts it into the restored deployments.
"""

import math
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

    def __post_init__(self) -> None:
        if not math.isfinite(self.quiet_since_s):
            raise SurgeError(f"quiet_since_s must be finite (got {self.quiet_since_s})")
        if self.held_instances < 0:
            raise SurgeError(f"held_instances must be >= 0 (got {self.held_instances})")

    def hold(
        self,
        now_s: float,
        downscale_delay_s: float,
        keep_alive_s: float,
        max_replicas: int | None = None,
    ) -> tuple[int, float | None]:
        """Instances the pool would still hold now had the controller not restarted (at most
        `max_replicas`), and when that number next falls (None: it is 0). As `decide` releases
        idle instances: each above the last after `downscale_delay_s`, the last after
        `keep_alive_s`."""
        held = self.held_instances
        if max_replicas is not None:
            held = min(held, max_replicas)
        if held == 0:
            return 0, None
        extra_until = self.quiet_since_s + downscale_delay_s
        if held > 1 and now_s < extra_until:
            return held, extra_until
        # the last of several goes once both delays have passed (decide's release loop)
        last_s = keep_alive_s if held == 1 else max(keep_alive_s, downscale_delay_s)
        last_until = self.quiet_since_s + last_s
        return (1, last_until) if now_s < last_until else (0, None)


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
) -> Carried | None:
    """What a restart at `now_s` would carry of a pool (module docstring): its peak, the
    instances it holds (or the `restart` it resumed from still holds for it), and since when
    it has been quiet: now if it is busy (its requests end with the controller); else the
    resumed `restart`'s time (no request since); else its instances' (`idle_since_s`,
    `policy.autoscale.idle_since`); else, at zero, the `last` carry's; else now. None when
    there is nothing to carry (no peak, no instance)."""
    held = instances
    if busy:
        quiet_s = now_s
    elif restart is not None:
        quiet_s, held = restart.quiet_since_s, max(instances, restart.held_instances)
    elif idle_since_s is not None:
        quiet_s = idle_since_s
    else:
        quiet_s = now_s if last is None else last.restart.quiet_since_s
    if peak_instances == 0 and held == 0:
        return None
    return Carried(peak_instances, Restart(quiet_s, held))
