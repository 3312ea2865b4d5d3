"""Per-layer cost of prefill and decode as linear models, for a model on a GPU.
In: a `ModelProfile`, a `GpuProfile` and the tensor-parallel degree. Out: a `CostModel` with,
per layer, prefill_s(tokens) = a_p + max(w, b_p * tokens) and decode_s(batch) = a_d + b_d *
batch (roofline: every step streams the layer's weights once, w seconds: decode is bound by it,
a prefill by its compute unless its tokens are few — then it is the read), or the measured
per-layer costs of a calibrated profile (`GpuProfile.measured_layer_costs_s`). Whole-model step
times multiply by the layers a GPU runs; with TP = g each GPU streams 1/g of the weights and
does 1/g of the FLOPs, plus an all-reduce cost.
"""

from dataclasses import dataclass

from surge.policy.blitzscale.monitor import InstanceCosts
from surge.sim.hardware import GpuProfile
from surge.sim.models import ModelProfile

TP_ALLREDUCE_S_PER_LAYER = 2e-5
"""Extra per-layer cost of a tensor-parallel step (two all-reduces over NVLink/PCIe)."""


@dataclass(frozen=True)
class CostModel:
    """Linear per-layer costs; `*_s` of a whole model are these times the layer count."""

    prefill_fixed_s: float
    """a_p: per-layer fixed cost of a prefill step."""
    prefill_per_token_s: float
    """b_p: per-layer cost of one prompt token."""
    decode_fixed_s: float
    """a_d: per-layer fixed cost of a decode step (weight streaming + launches)."""
    decode_per_seq_s: float
    """b_d: per-layer cost of one sequence in the decode batch."""
    num_layers: int
    """Layers of the whole model."""
    prefill_floor_s: float = 0.0
    """w: per-layer time to stream the layer's weights, the least a prefill step takes
    however few its tokens (a roofline's memory bound; 0: none, as in a measured profile)."""

    def prefill_s(self, tokens: int, layers: int | None = None) -> float:
        """Seconds to prefill `tokens` prompt tokens through `layers` (default all)."""
        n = self.num_layers if layers is None else layers
        return n * (
            self.prefill_fixed_s + max(self.prefill_floor_s, self.prefill_per_token_s * tokens)
        )

    def prefill_parts_s(self, parts: list[tuple[int, int]]) -> float:
        """Seconds of one prefill step whose requests run different numbers of layers:
        `parts` is (tokens, layers) per request (BlitzScale live scaling leaves a request
        only its last layers); the fixed cost is paid once per layer any request runs.
        With every request at `num_layers` this is `prefill_s` of the total tokens."""
        layers = max(n for _, n in parts)
        compute = self.prefill_per_token_s * sum(t * n for t, n in parts)
        return layers * self.prefill_fixed_s + max(layers * self.prefill_floor_s, compute)

    def decode_s(self, batch: int, layers: int | None = None) -> float:
        """Seconds of one decode step of `batch` sequences through `layers`."""
        n = self.num_layers if layers is None else layers
        return n * (self.decode_fixed_s + self.decode_per_seq_s * batch)


def cost_model(model: ModelProfile, gpu: GpuProfile, tp: int = 1) -> CostModel:
    """The linear cost model of `model` on `tp` GPUs of type `gpu`."""
    if gpu.measured_layer_costs_s is not None and tp == 1:
        a_p, b_p, a_d, b_d = gpu.measured_layer_costs_s
        return CostModel(a_p, b_p, a_d, b_d, model.num_layers)
    flops_s = gpu.tflops * 1e12 * gpu.prefill_efficiency * tp
    bytes_s = gpu.mem_bandwidth_gbs * 1e9 * gpu.decode_efficiency * tp
    overhead = gpu.layer_overhead_s + (TP_ALLREDUCE_S_PER_LAYER if tp > 1 else 0.0)
    per_token = model.flops_per_token_per_layer / flops_s
    weights_s = model.layer_bytes / bytes_s
    return CostModel(
        prefill_fixed_s=overhead,
        prefill_per_token_s=per_token,
        decode_fixed_s=overhead + weights_s,
        decode_per_seq_s=per_token,
        num_layers=model.num_layers,
        prefill_floor_s=weights_s,
    )


def monitor_costs(
    model: ModelProfile, gpu: GpuProfile, tp: int, max_prefill_tokens: int, max_batch: int
) -> InstanceCosts:
    """One instance as BlitzScale's load monitor profiles it offline (§5.3,
    `policy.blitzscale.monitor`): `model`'s cost model on `tp` GPUs of type `gpu` and the
    engine's step limits. The one construction the simulator (`Simulation`), `surge serve`
    under GPU-time emulation (`control/emulation.instance_costs`) and the reproductions'
    JSON (`benchmarks/paper/blitzscale/monitor_bound.py`) share."""
    cost = cost_model(model, gpu, tp)
    return InstanceCosts(cost.prefill_s, cost.decode_s, max_prefill_tokens, max_batch)
