"""When a node agent lets its engines compile their decode graphs (`EngineConfig.
compile_decode`): only once the node has been quiet for `EngineConfig.compile_quiet_s`.

Why: a decode graph's compile runs dynamo and inductor in the agent's own process, seconds
of Python per graph holding the GIL, and the agent's event loop, which moves a scale-out's
blocks and streams tokens, waits for it. Measured (benchmarks/systems/blitzscale.py,
lambdascale, docs/engine.md): with the compile beside the burst a hot scale-out of the 32-MB
model took 7.7-9.8 s instead of 2.0 s; not the CPU (the same scale-out with compile off took
2.0 s at load 8), nor the GIL switch interval alone (0.5 ms instead of 5: 7.9-8.4 s).

What flows: whether anything is in flight on the node now and when it last was, in; whether
a compile may start now, out. `runtime/node/compile_quiet.py` carries it out (it sets the
gate each `DecodeGraph` waits on before each graph). Pure: no clock, no I/O.
"""


def may_compile(busy: bool, now_s: float, last_busy_s: float | None, quiet_s: float) -> bool:
    """True when nothing is in flight now and nothing was for the last `quiet_s` seconds
    (`last_busy_s` None: never busy yet, e.g. a warm node before its first request)."""
    if busy:
        return False
    return last_busy_s is None or now_s - last_busy_s >= quiet_s
