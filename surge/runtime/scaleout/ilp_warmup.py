"""The zigzag ILP's solver imported before a user's scale-out needs it (BlitzScale §5.2, Eq. 1).

A live-scaling system's first look at the queue solves Eq. 1 (`policy.blitzscale.
live_scaling.choose_schedule`) with HiGHS through `scipy.optimize`, whose import costs
0.8-1.1 s of CPU in a process that already holds numpy (`python -X importtime`) and was
measured at ~4 s on a machine at load ~11. Imported by the first look, that cost landed on
the request path: the first live scale-out of a blitzscale deployment decided seconds late,
while its target's layers kept landing and the queue it was meant to relieve waited. Started
when the multicast started was too late as well: BlitzScale goes live once its first block
lands (`live_start_fraction` 1/16), so the first look came while the import still ran and
waited on it.

`warm_solver` starts the import in a daemon thread; the controller calls it when a
deployment of a live-scaling system is created or restored (`control/deployments.py`), and
every scale-out that may live-scale calls it again as it starts (`scaleout/run.py`). Python's
import system makes it happen once per process: a later call finds the module loaded, and a
look that comes while the thread still imports waits only for the rest of it. The decision
is unchanged (the same solver, the same schedule): only when its import is paid moves.
"""

import logging
import threading

from surge.policy.blitzscale import zigzag
from surge.policy.systems import SystemConfig

log = logging.getLogger(__name__)


def needs_solver(system: SystemConfig) -> bool:
    """`system` live-scales (BlitzScale §4, §5.2): its looks solve the zigzag ILP."""
    return system.serve_while_loading == "live"


def _import_solver() -> None:
    try:
        zigzag.milp_solver()  # looked up at call time: a test may slow it down
    except Exception as e:  # the look will raise it where it is handled; not here
        log.warning("the zigzag ILP's solver could not be imported ahead: %r", e)


def warm_solver(system: SystemConfig) -> threading.Thread | None:
    """Import the zigzag ILP's solver in the background if `system` live-scales; the thread
    doing it (None when `system` does not need it)."""
    if not needs_solver(system):
        return None
    thread = threading.Thread(target=_import_solver, name="surge-ilp-import", daemon=True)
    thread.start()
    return thread
