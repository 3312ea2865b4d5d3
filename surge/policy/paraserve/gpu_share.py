"""ParaServe's fractional GPUs: how much of which GPU a pipeline worker holds (§4.1, §9).

ParaServe §4.1.1: "individual workers in a pipeline parallelism group allocate GPU memory
proportionally to their partitioned model size by default, and the amount of allocated
memory also determines the GPU computation quota". §4.1.2 names the two sizes Alg. 1
chooses between: a full-memory worker (the memory of the unpartitioned model) and a
low-memory worker (1/s of it). §9: pipeline parallelism "improves cluster-level resource
utilization by enabling finer-grained GPU memory allocation": several low-memory workers
(of one group or of several models) share one GPU.

In: the GPUs' free shares (what fraction of each GPU is not held), a worker's share.
Out, pure and deterministic:
- `low_memory_share`: the fraction of one GPU a low-memory worker holds (None: whole GPUs,
  when even a full worker needs more than one GPU);
- `pick_gpu`: which GPU a fractional worker takes (best fit: the fullest GPU it fits on,
  so shared GPUs fill before whole ones are broken into, and whole GPUs stay free for
  full-memory workers and whole-GPU instances);
- `consolidation_gpu`: where a consolidating worker (§6.1) grows into a full worker:
  its own GPU if the rest of that GPU is free, else a wholly free GPU of its machine;
- `pipeline_speed`: a group's serving speed from its workers' compute quotas (the
  slowdown factor s − w + w/s of Alg. 1's Eq. 1/2, for any mix of shares).
"""

from collections.abc import Sequence

from surge.errors import SurgeError

SHARE_EPS = 1e-9
"""Slack on share arithmetic (1/3 + 1/3 + 1/3 fills a GPU)."""


def low_memory_share(pipeline_size: int, full_worker_gpus: int) -> float | None:
    """§4.1.2: a low-memory worker of an s-worker group holds 1/s of a full worker's GPU
    memory, and with it 1/s of its compute quota (§4.1.1). A fraction of one GPU when a
    full worker fits one GPU (`full_worker_gpus` 1) and s > 1; None (whole GPUs, the
    fewest that hold its part) otherwise."""
    if pipeline_size < 1 or full_worker_gpus < 1:
        raise SurgeError("pipeline_size and full_worker_gpus must be >= 1")
    if full_worker_gpus != 1 or pipeline_size == 1:
        return None
    return 1.0 / pipeline_size


def pick_gpu(free_shares: Sequence[tuple[int, float]], share: float) -> int | None:
    """The GPU a worker holding `share` of one GPU takes, from (gpu id, free share) pairs:
    the one with the least free share that still fits it, lowest id on ties; None if none
    fits."""
    if not 0 < share <= 1:
        raise SurgeError(f"a GPU share must be in (0, 1] (got {share})")
    fits = [(free, gpu) for gpu, free in free_shares if free + SHARE_EPS >= share]
    return min(fits)[1] if fits else None


def consolidation_gpu(
    own_gpu: int, own_share: float, free_shares: Sequence[tuple[int, float]]
) -> int | None:
    """Where a worker holding `own_share` of `own_gpu` becomes a full (one-GPU) worker
    (§6.1, "these workers evolve into individual workers that host the entire model"):
    `own_gpu` when the rest of it is free (it grows in place), else the lowest wholly free
    GPU of its machine (`free_shares`: that machine's GPUs), else None (it cannot)."""
    free = dict(free_shares)
    if free.get(own_gpu, 0.0) + own_share + SHARE_EPS >= 1.0:
        return own_gpu
    whole = sorted(g for g, f in free.items() if f + SHARE_EPS >= 1.0 and g != own_gpu)
    return whole[0] if whole else None


def pipeline_speed(shares: Sequence[float]) -> float:
    """Speed of a pipeline group, relative to one full worker, whose s stages (equal parts
    of the layers, run one after another per step) hold compute quotas `shares` (1.0 = a
    whole full worker): 1 / Σ (1/s)/q_i. s low-memory workers (q = 1/s) run at 1/s, w
    full-memory ones and s − w low-memory ones at 1/(s − w + w/s): Eq. 2's factor."""
    if not shares or min(shares) <= 0:
        raise SurgeError("a pipeline needs one or more shares > 0")
    s = len(shares)
    return 1.0 / sum(1.0 / (s * q) for q in shares)
