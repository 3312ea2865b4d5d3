"""Where a simulated endpoint runs: the GPUs of each of its workers.

In: chosen by scaling (`policy.placement`), loading (execution pipelines), groups
(ParaServe) and FlexPipe refactoring. Out: a frozen `Placement` an `Instance` carries.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    """The GPUs an endpoint runs on."""

    workers: tuple[tuple[int, ...], ...]
    """GPUs of every worker (one tensor-parallel group each), in stage order; one worker
    for a plain instance, several for a pipeline (λScale execution pipeline, ParaServe
    group)."""
    machine: int
    """Machine of the first worker."""
    shares: tuple[float, ...] = ()
    """Fraction of its one GPU each worker holds (ParaServe low-memory workers,
    `policy.paraserve.gpu_share`); empty: every worker holds its GPUs whole."""

    @property
    def gpus(self) -> tuple[int, ...]:
        """The first worker's GPUs (its lead GPU sends and receives blocks)."""
        return self.workers[0]

    @property
    def all_gpus(self) -> tuple[int, ...]:
        """Every GPU the endpoint holds."""
        return tuple(g for w in self.workers for g in w)

    def share(self, worker: int) -> float:
        """Fraction of its GPU(s) worker `worker` holds (1.0: whole GPUs)."""
        return self.shares[worker] if self.shares else 1.0

    @property
    def gpu_count(self) -> float:
        """GPUs it holds, counting a shared GPU by the fraction held (GPU-seconds)."""
        return sum(len(w) * self.share(i) for i, w in enumerate(self.workers))


NOWHERE = Placement(((0,),), 0)
"""Placement of an endpoint built outside a cluster (unit tests)."""
