"""Which micro-batch of a pipeline a request joins.

In: the requests each micro-batch of a pipeline holds now (running or waiting there), for
the micro-batches that take new requests (`num_micro_batches` of them: λScale's 2,
FlexPipe's η for η stages, `policy.flexpipe.microbatch`). Out: the micro-batch each new
request joins: the one holding the fewest, ties to the first (`join_micro_batch`; for a
burst, one after another, `spread_over_micro_batches`).

Each micro-batch is its own stream through the stages (λScale Fig. 6a; FlexPipe §7 Eq. 12:
a pipeline of m stages keeps m micro-batches in flight, one per stage), so a burst of
requests is not one prefill through every layer: each micro-batch prefills its own
requests, and the micro-batches follow each other through the stages one stage-time
apart. A burst of four on a 4-stage pipeline gets its first tokens after 4/4, 5/4, 6/4
and 7/4 of one request's prefill, not all after four requests' prefill.

The runtime's pipeline head (`runtime/pipeline_endpoint.py` `PipelineEndpoint.submit`: one head
engine per micro-batch) and the simulator's (`sim/serving_engine.py` `ServingEngine.submit`: one
head engine per micro-batch over `sim/stage_line.py`) both call it
(`tests/parity/test_pipeline_prefill_parity.py`).
Pure and deterministic.
"""

from collections.abc import Sequence

from surge.errors import SurgeError


def join_micro_batch(loads: Sequence[int]) -> int:
    """The micro-batch a new request joins: the one whose `loads` (requests it holds) is
    least, ties to the first."""
    if not loads:
        raise SurgeError("a pipeline has >= 1 micro-batch")
    return min(range(len(loads)), key=lambda i: (loads[i], i))


def spread_over_micro_batches(loads: Sequence[int], num_requests: int) -> tuple[int, ...]:
    """Where each of `num_requests` requests arriving together (in order) goes:
    `join_micro_batch` for each in turn, the loads counting the ones placed before it."""
    if num_requests < 0:
        raise SurgeError(f"num_requests must be >= 0 (got {num_requests})")
    held = list(loads)
    out = []
    for _ in range(num_requests):
        i = join_micro_batch(held)
        held[i] += 1
        out.append(i)
    return tuple(out)
