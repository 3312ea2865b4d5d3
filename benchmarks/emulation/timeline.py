"""What each scale-out of an emulated serving run did, when: read from the controller's events.

In: the timeline events a `Controller` published during a replay (`surge/events.py`:
`ScaleOutStarted`, `ScaleOutDone`, `BlockLanded`, `InstanceUp`), a map from the bus's
stamps to emulated seconds, and samples of each node's outgoing P/D K/V hand-offs. Out: one
row per scale-out for the benchmark's JSON (`serving.serve_workload`), so a late or slow
scale-out shows where its time went: the decision, the multicast's blocks, the instance up,
and whether its sources' NICs also carried K/V. `request_timeline` does
the same for each request (queued, routed, first and second token: under P/D the second
comes after the hand-off, so a parked request shows). `mechanism_timeline` lists BlitzScale's
live batches and mutations, so two runs (or the runtime and the simulator) that part at one
decision show which.
"""

from collections.abc import Callable
from typing import Any

from surge.events import (
    BlockLanded,
    InstanceUp,
    LiveBatch,
    Mutation,
    ScaleOutDone,
    ScaleOutStarted,
    TimelineEvent,
)
from surge.runtime.request import ServeRequest


def request_timeline(reqs: list[ServeRequest], start: float) -> list[list[Any]]:
    """Per request, in emulated s from `start` (None: never): arrival, routed to an
    endpoint, first token, second token, done, and the endpoints it went to."""

    def at(t: float | None) -> float | None:
        return None if t is None else round(t - start, 3)

    return [
        [
            at(r.arrival_t),
            at(r.dispatched_t),
            at(r.first_token_t),
            at(r.token_times[1] if len(r.token_times) > 1 else None),
            at(r.done_t),
            list(r.hops),
        ]
        for r in reqs
    ]


def scale_out_timeline(
    events: list[TimelineEvent],
    emulated_s: Callable[[float], float],
    egress: list[tuple[float, dict[int, int]]],
) -> list[dict[str, Any]]:
    """Each scale-out in emulated s from the replay's start (`emulated_s` maps a bus stamp):
    when placement chose its nodes, its multicast sources, each node's first and last GPU
    block and when it served, when the scale-out ended and took how long; and, from the
    samples of `egress` (P/D K/V hand-offs leaving each node), the share of its span each
    source was sending K/V too (BlitzScale §5.1: a source's NIC shared with serving)."""
    out: list[dict[str, Any]] = []
    open_: dict[tuple[int, ...], dict[str, Any]] = {}
    for ev in events:
        t = round(emulated_s(ev.t_s), 3)
        if isinstance(ev, ScaleOutStarted):
            open_[ev.nodes] = {"nodes": list(ev.nodes), "started_s": t, "blocks": {}, "up": {}}
            out.append(open_[ev.nodes])
        elif isinstance(ev, ScaleOutDone) and ev.nodes in open_:
            row = open_.pop(ev.nodes)
            row |= {"done_s": t, "kind": ev.kind, "took_s": round(ev.load_s, 3)}
            row["sources"] = list(ev.sources)
        elif isinstance(ev, BlockLanded) and ev.tier == "gpu":
            for row in out:
                if ev.node in row["nodes"] and "done_s" not in row:
                    first, _ = row["blocks"].get(ev.node, (t, t))
                    row["blocks"][ev.node] = (first, t)
        elif isinstance(ev, InstanceUp):
            for row in out:
                if ev.node in row["nodes"] and "done_s" not in row:
                    row["up"][ev.node] = t
    for row in out:
        lo, hi = row["started_s"], row.get("done_s", float("inf"))
        window = [e for t, e in egress if lo <= t <= hi]
        row["source_sending_kv"] = {
            s: round(sum(e.get(s, 0) > 0 for e in window) / len(window), 3) if window else None
            for s in row.get("sources", [])
        }
        row["blocks"] = {n: list(v) for n, v in row["blocks"].items()}
    return out


def mechanism_timeline(
    events: list[TimelineEvent], emulated_s: Callable[[float], float]
) -> list[list[Any]]:
    """BlitzScale's decisions in emulated s from the replay's start: each live batch as
    ["live", its start (requests taken), its end (first tokens sampled, handed on), new
    node, old node, layers on the new node, requests, schedule] (its requests' hops name it
    `live-...`) and each mutation as ["mutation", when, node]."""
    out: list[list[Any]] = []
    for ev in events:
        t = round(emulated_s(ev.t_s), 3)
        if isinstance(ev, LiveBatch):
            start = round(t - ev.took_s, 3)
            row = [start, t, ev.new_node, ev.old_node, ev.split_layer, ev.num_requests]
            out.append(["live", *row, ev.schedule])
        elif isinstance(ev, Mutation):
            out.append(["mutation", t, ev.node])
    return out
