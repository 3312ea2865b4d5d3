"""What a scale-out assumes of compute and the fetch link before it has measured them.

What flows: one `ServingEstimates` per controller (`control/emulation.serving_estimates`:
the host's rule-of-thumb constants below, or, under GPU-time emulation, the emulated GPU's
cost model and the emulated registry link, in the serving clock's emulated seconds) into
every `ScaleOutContext` and FlexPipe's granularity loop; read by ParaServe's Alg. 1 inputs
(`scaleout/paraserve.alg1_inputs_of`), FlexPipe's layer profile before its stages are
profiled and its model load time from each tier (`scaleout/flexpipe.layer_profile`,
`load_seconds`, `tier_rates`). All of them are the store's own bytes over these rates. Owned
by runtime/scaleout/.
"""

from dataclasses import dataclass

from surge.policy.flexpipe.scaling_load import TierRates

WEIGHT_READ_BYTES_PER_S = 10e9
"""Weights read per second by one decode step (memory bound), for t_d."""
PREFILL_OVER_DECODE = 4.0
"""t_p / t_d for a short prompt (a prefill reads the weights once and computes more)."""
DEFAULT_FETCH_GBPS = 10.0
"""Network rate a worker's fetch is estimated at when the controller knows no link speed."""
DEFAULT_HOST_GBPS = 100.0
"""Host memory -> GPU: PCIe 4.0 x16 is ~200 Gbit/s; half of it is what a loader reaches in
practice (ParaServe's Alg. 1 load term, `scaleout/paraserve.PCIE_GBPS`, is this value)."""
DEFAULT_DISK_GBPS = 16.0
"""Local disk -> GPU: one NVMe SSD (~2 GB/s; the simulator's presets' `ssd_gbps`)."""


@dataclass(frozen=True)
class ServingEstimates:
    """Compute and fetch rates for the model store a deployment serves, before measuring."""

    weight_read_bytes_per_s: float = WEIGHT_READ_BYTES_PER_S
    """Store bytes one decode step reads per second (it reads every weight once)."""
    prefill_over_decode: float = PREFILL_OVER_DECODE
    """A short prompt's prefill over a one-sequence decode step."""
    fetch_gbps: float = DEFAULT_FETCH_GBPS
    """Rate a worker fetches store bytes at from the registry, Gbit/s."""
    host_gbps: float = DEFAULT_HOST_GBPS
    """Rate a worker loads store bytes at from its host memory, Gbit/s."""
    disk_gbps: float = DEFAULT_DISK_GBPS
    """Rate a worker loads store bytes at from its local disk, Gbit/s."""

    def tier_rates(self, fetch_gbps: float | None = None) -> TierRates:
        """Each load tier's rate (FlexPipe's S_j, `policy.flexpipe.scaling_load`), the
        registry at `fetch_gbps` when the controller knows the link (else `fetch_gbps`)."""
        return TierRates(self.host_gbps, self.disk_gbps, fetch_gbps or self.fetch_gbps)

    def decode_s(self, store_bytes: int) -> float:
        """One decode step of a model of `store_bytes`."""
        return store_bytes / self.weight_read_bytes_per_s


HOST_ESTIMATES = ServingEstimates()
"""The rule-of-thumb constants above (no emulation)."""
