"""GPU-time emulation: real agents, real bytes and real tokens, paced to an emulated GPU cluster.

The middle one of the three ways to run the same decisions (the real runtime, this, the
simulator; docs/architecture.md): the runtime's own code paths, with every engine step
lasting what the emulated GPU takes for the emulated model (`pacing.py`, from the
simulator's cost model) and every rate scaled by real bytes / emulated bytes (`cluster.py`),
all stretched by a time dilation D (`settings.py`). Imports only the
simulator's profile and cost-model modules (`sim/hardware.py`, `sim/models.py`,
`sim/costs.py`), never its loop; `runtime/` imports this package. See docs/emulation.md.
"""

from surge.emulation.cluster import (
    ByteScale,
    EmulatedNode,
    Emulation,
    TrafficCharges,
    block_charges,
    traffic_charges,
)
from surge.emulation.pacing import PacingCounts, StepPacer
from surge.emulation.settings import EmulationConfig

__all__ = [
    "ByteScale",
    "EmulatedNode",
    "Emulation",
    "EmulationConfig",
    "PacingCounts",
    "StepPacer",
    "TrafficCharges",
    "block_charges",
    "traffic_charges",
]
