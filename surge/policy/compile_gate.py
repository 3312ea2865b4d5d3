"""When a node agent lets its engines compile their decode graphs (`EngineConfig.
compile_decode`): once the node has been quiet for `EngineConfig.compile_quiet_s`; or, on a
node that only serves (requests or stage steps, no load or block transfer), once the compile
has been deferred `EngineConfig.compile_defer_max_s`.

Why a gate: a decode graph's compile runs dynamo and inductor in the agent's own process,
seconds of Python per graph holding the GIL, and the agent's event loop, which moves a
scale-out's blocks and streams tokens, waits for it. Measured (benchmarks/systems/
blitzscale.py, lambdascale, docs/engine.md): with the compile beside the burst a hot
scale-out of the 32-MB model took 7.7-9.8 s instead of 2.0 s; not the CPU (the same
scale-out with compile off took 2.0 s at load 8), nor the GIL switch interval alone (0.5 ms
instead of 5: 7.9-8.4 s). That harm is to transfers (the emulated link's token bucket, block
arrival), so a load, block transfer or multicast always holds the compile.

Why a bound for serving: a node that serves steadily is never quiet, and would decode eager
for good (SmolLM2: compiled 11.2 vs eager 8.2 tokens/s at batch 1, 95.0 vs 62.9 at batch 8).
Deferring is renting (each second eager forgoes the compiled step's gain), compiling is
buying (the tokens the compile costs the steps beside it): waiting as long as the compile
costs bounds the loss at twice the best choice made knowing the future (the ski-rental
bound). `compile_defer_max_s`'s default comes from that measurement (docs/engine.md).

What flows: what is in flight on the node now (`holding`: an op about a model; `serving`: a
request or stage step) and the clock, in; the node's `Activity` (pure state) and whether a
compile may start now, out. `runtime/node/compile_quiet.py` carries it out (it sets the
gate each `DecodeGraph` waits on before each graph). Pure: no clock, no I/O.
"""

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Activity:
    """What a node's compile gate remembers (seconds on the agent's monotonic clock)."""

    last_busy_s: float | None = None
    """When anything was last in flight; None: never yet (a warm node before its first op)."""
    last_hold_s: float | None = None
    """When a load, block transfer or multicast was last in flight."""
    busy_since_s: float | None = None
    """When the present stretch without a quiet spell began (None: the node is quiet)."""
    holding: bool = False
    """At the last observation: a load, block transfer or multicast in flight."""
    serving: bool = False
    """At the last observation: a request in a local instance or a stage step."""


def observe(
    activity: Activity, now_s: float, holding: bool, serving: bool, quiet_s: float
) -> Activity:
    """`activity` after seeing the node at `now_s`: `holding` an op about a model (a load,
    a block sent or pulled, a multicast), `serving` (a request in a local instance, a stage
    step)."""
    if not (holding or serving):
        quiet = activity.last_busy_s is None or now_s - activity.last_busy_s >= quiet_s
        since = None if quiet else activity.busy_since_s
        return replace(activity, busy_since_s=since, holding=False, serving=False)
    since = activity.busy_since_s
    if since is None:
        since = now_s
    return Activity(
        last_busy_s=now_s,
        last_hold_s=now_s if holding else activity.last_hold_s,
        busy_since_s=since,
        holding=holding,
        serving=serving,
    )


def may_compile(activity: Activity, now_s: float, quiet_s: float, defer_max_s: float) -> bool:
    """True when nothing was in flight for the last `quiet_s` seconds; or, with no load or
    transfer for `quiet_s` (a scale-out's ops come in a train), once the compile has waited
    `defer_max_s` since the node stopped being quiet or its last transfer ended, whichever
    is later (`activity` as `observe` left it at `now_s`)."""
    a = activity
    if a.holding:
        return False
    if not a.serving and (a.last_busy_s is None or now_s - a.last_busy_s >= quiet_s):
        return True
    if a.last_hold_s is not None and now_s - a.last_hold_s < quiet_s:
        return False
    froms = [x for x in (a.busy_since_s, a.last_hold_s) if x is not None]
    return bool(froms) and now_s - max(froms) >= defer_max_s
