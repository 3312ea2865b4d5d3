"""A scenario's arrivals: each model group's source split over its models, merged.

In: a `Scenario` (its groups' `Arrivals`), the traces directory and the seed. Out: one
`Trace` whose `model_index` is the scenario's model index (group by group, in
`Scenario.model_names` order), cut to the scenario's duration. Sources are loaded once
per seed (two groups naming one generator get different seeds unless they name one;
two naming one file each take their own `share` of the same requests). Splits:
`uniform` (random model per request), `round-robin` (request i to model i mod count,
like ParaServe §8.3 maps functions), `zipf` (skewed popularity), `trace` (the source's
own model ranks; ranks >= count are dropped), `each` (each model its own draw of a
generator, seed + model number: independent per-model processes).
"""

from pathlib import Path

import numpy as np

from surge.errors import SurgeError
from surge.sim.scenario import Arrivals, Scenario
from surge.traces.request import Trace, make_trace
from surge.traces.resolve import load_trace
from surge.traces.transform import scale_rate, time_slice


def split_models(trace: Trace, count: int, arrivals: Arrivals, rng: np.random.Generator) -> Trace:
    """`trace` with model_index in [0, count) as `arrivals.split` says (see module doc)."""
    n = trace.num_requests
    if arrivals.split == "trace":
        keep = trace.model_index < count
        if not keep.any():
            raise SurgeError(f"trace {arrivals.trace} has no requests of its first {count} models")
        return trace.take(keep)
    if arrivals.split == "round-robin":
        index = np.arange(n, dtype=np.int64) % count
    else:
        s = arrivals.zipf_s if arrivals.split == "zipf" else 0.0
        weights = 1.0 / np.arange(1, count + 1) ** s
        index = rng.choice(count, size=n, p=weights / weights.sum()).astype(np.int64)
    return Trace(trace.name, trace.arrival_s, trace.input_tokens, trace.output_tokens, index, ())


def build_trace(scenario: Scenario, traces_dir: Path | None = None) -> Trace:
    """The merged trace of every model of `scenario` (see module docstring)."""
    rng = np.random.default_rng(scenario.seed)
    sources: dict[tuple[str, int], Trace] = {}
    parts: list[Trace] = []
    offsets: list[int] = []
    base = 0
    for position, group in enumerate(scenario.groups):
        arr = group.arrivals
        seed = scenario.seed + position if arr.seed is None else arr.seed
        draws = range(group.count) if arr.split == "each" else range(1)
        for draw in draws:
            key = (arr.trace, seed + 1000 * draw)
            if key not in sources:
                sources[key] = load_trace(arr.trace, key[1], traces_dir)
            src = time_slice(scale_rate(sources[key], arr.rate_scale), arr.start_s, None)
            if scenario.duration_s is not None:
                src = time_slice(src, 0.0, scenario.duration_s)
            if arr.share < 1:
                src = src.take(rng.random(src.num_requests) < arr.share)
            if arr.split == "each":
                index = np.full(src.num_requests, draw, dtype=np.int64)
                part = Trace(src.name, src.arrival_s, src.input_tokens, src.output_tokens, index)
            else:
                part = split_models(src, group.count, arr, rng)
            parts.append(part)
            offsets.append(base)
        base += group.count
    merged = make_trace(
        scenario.name,
        np.concatenate([p.arrival_s for p in parts]),
        np.concatenate([p.input_tokens for p in parts]),
        np.concatenate([p.output_tokens for p in parts]),
        np.concatenate([p.model_index + off for p, off in zip(parts, offsets, strict=True)]),
        scenario.model_names,
    )
    if merged.num_requests == 0:
        raise SurgeError(f"scenario {scenario.name}: no requests in the chosen window")
    return merged
