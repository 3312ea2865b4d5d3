"""What one simulated serving engine is: its cost model, role and limits.

In: a `CostModel` (`sim/costs.py`) and the engine's limits, from the simulator's scaling
and instance code. Out: an `EngineSpec` that a `Batcher` (`sim/batching.py`) starts from.
Owned by sim/.
"""

from dataclasses import dataclass

from surge.sim.costs import CostModel


@dataclass(frozen=True)
class EngineSpec:
    """What one serving engine is: its cost model and limits (a `Batcher` starts from it;
    role, speed and hop may change later)."""

    cost: CostModel
    role: str
    """`both`, `prefill` or `decode` (see the module docstring)."""
    max_batch: int
    """Requests running at once (and the router's capacity)."""
    kv_capacity_tokens: int
    max_prefill_tokens: int
    """Tokens one prefill step admits (at least one request)."""
    speed: float = 1.0
    """Relative speed (a loading or shared GPU is slower)."""
    hop_s: float = 0.0
    """Activation hop per step between its pipeline stages."""
