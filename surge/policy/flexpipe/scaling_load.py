"""FlexPipe §7 Eq. 12's S_j: how long a new group's stages take to load, and from where.

In: the model's bytes, the tier each candidate node holds the model in (`host` memory,
local `disk`, or none: the `remote` registry, `policy.startup.OWN_TIERS`) and each tier's
rate (`TierRates`). Out: the seconds the whole model takes over the tier a new group
loads from (`new_group_load_s`; a stage of m loads 1/m of it in parallel, which
`system.scale_out_num_stages` and `system.split_stages` divide by).

The decision: Eq. 12's S_j is "the initialization time for scaling operations", and §7's
memory-aware elastic scaling is what makes it short: FlexPipe "maintains parameter copies
in host memory even after GPU eviction" and Eq. 13 places new stages on the servers that
hosted the model, "transforming cold starts into warm starts". So a new group loads from
the best tier its candidate nodes hold (host memory over PCIe, else the local disk, else
the registry link), and S_j is the model over that tier's rate. Before, the runtime
(`runtime/scaleout/flexpipe.py`) always charged the registry link and the simulator
(`sim/flexpipe.py`) always PCIe: the same burst got 4 stages in one and 2 in the other
(docs/emulation.md, FlexPipe §9 at CV 8).

The runtime (the scale-out's destination and spares, the controller's free nodes) and the
simulator (the free GPUs of the model's node group) both call `new_group_load_s`
(`tests/parity/test_flexpipe_load_parity.py`). Pure and deterministic.
"""

from collections.abc import Iterable
from dataclasses import dataclass

from surge.errors import SurgeError

TIER_ORDER = ("host", "disk", "remote")
"""Load tiers, fastest first (`policy.startup.OWN_TIERS`)."""


@dataclass(frozen=True)
class TierRates:
    """What each tier loads a model's bytes into one GPU at, Gbit/s."""

    host_gbps: float
    """Host memory -> GPU (PCIe)."""
    disk_gbps: float
    """Local disk (SSD) -> GPU."""
    remote_gbps: float
    """The registry link (the node's fetch link)."""

    def __post_init__(self) -> None:
        if not (self.host_gbps > 0 and self.disk_gbps > 0 and self.remote_gbps > 0):
            raise SurgeError(f"tier rates must be > 0 Gbit/s (got {self})")

    def of(self, tier: str) -> float:
        """The rate of `tier` (one of `TIER_ORDER`)."""
        if tier not in TIER_ORDER:
            raise SurgeError(f"tier must be one of {TIER_ORDER} (got {tier!r})")
        return {"host": self.host_gbps, "disk": self.disk_gbps, "remote": self.remote_gbps}[tier]


def new_group_tier(candidate_tiers: Iterable[str]) -> str:
    """The tier a new group loads from: the best its candidate nodes hold (module
    docstring); `remote` when there is no candidate."""
    tiers = set(candidate_tiers)
    if unknown := tiers - set(TIER_ORDER):
        raise SurgeError(f"tiers must be among {TIER_ORDER} (got {sorted(unknown)})")
    return next((t for t in TIER_ORDER if t in tiers), "remote")


def new_group_load_s(model_bytes: int, candidate_tiers: Iterable[str], rates: TierRates) -> float:
    """§7 Eq. 12's S_j for one stage: the whole model (`model_bytes`) over the rate of the
    tier a new group loads from (`new_group_tier`); a stage of m loads 1/m of it."""
    if model_bytes < 1:
        raise SurgeError(f"a model has >= 1 byte (got {model_bytes})")
    return model_bytes * 8 / (rates.of(new_group_tier(candidate_tiers)) * 1e9)
