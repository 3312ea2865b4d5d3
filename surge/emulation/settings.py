"""The settings of a GPU-time emulation: which cluster and model the real agents stand for.

What flows: `surge serve --emulate PRESET:MODEL --time-dilation D`, a benchmark's flags or a
`LocalClusterConfig.emulation` become one `EmulationConfig`, validated once here; the
launchers (`runtime/launch/`) turn it into each agent's scaled rates (`emulation/cluster.py`)
and each agent paces its engine steps with it (`emulation/pacing.py`). PRESET and MODEL are
the simulator's own profiles (`surge/sim/profiles/clusters.json`, `models.json`), so one
scenario runs on real agents and in `surge simulate` with the same hardware. Owned by
emulation/; see docs/emulation.md.
"""

from dataclasses import dataclass

from surge.errors import SurgeError
from surge.sim.hardware import cluster_presets, load_cluster
from surge.sim.models import ModelProfile, load_model, model_names

MAX_TIME_DILATION = 1000.0
"""A dilation past this makes an emulated second last over 16 real minutes: a typo, not a plan."""
DEFAULT_KV_BUDGET_BYTES = 256 << 20
"""Host memory one runner's KV cache may take (the emulated GPU's capacity is clipped to it:
a 13B model on an 80 GiB GPU has room for ~73k tokens, which a small model's cache would hold
in gigabytes of the host's memory per agent)."""


@dataclass(frozen=True)
class EmulationConfig:
    """Real agents paced as `model` on the GPUs and links of cluster preset `preset`."""

    preset: str
    """A cluster preset of the simulator (`lambdascale-testbed1`, `paraserve-1`, ...)."""
    model: str
    """A model profile of the simulator (`llama2-13b`, ...): what the real store stands for."""
    time_dilation: float = 1.0
    """D: an emulated second lasts D real seconds (every step and every transfer D times
    longer), so the real work fits the host's cores; results are reported divided by D."""
    kv_budget_bytes: int = DEFAULT_KV_BUDGET_BYTES
    """Most host memory one runner's KV cache takes (see `DEFAULT_KV_BUDGET_BYTES`)."""

    def __post_init__(self) -> None:
        if self.preset not in cluster_presets():
            raise SurgeError(
                f"unknown emulation preset {self.preset!r}; choose one of "
                f"{', '.join(cluster_presets())} (as PRESET:MODEL)"
            )
        if self.model not in model_names():
            raise SurgeError(
                f"unknown emulated model {self.model!r}; choose one of "
                f"{', '.join(model_names())} (as PRESET:MODEL)"
            )
        if not 0 < self.time_dilation <= MAX_TIME_DILATION:
            raise SurgeError(
                f"--time-dilation must be in (0, {MAX_TIME_DILATION:g}] (got {self.time_dilation})"
            )
        if self.kv_budget_bytes < 1:
            raise SurgeError("the emulation's kv_budget_bytes must be >= 1")

    @staticmethod
    def parse(spec: str, time_dilation: float = 1.0) -> "EmulationConfig":
        """`PRESET:MODEL` (e.g. `lambdascale-testbed1:llama2-13b`) and a dilation."""
        preset, sep, model = spec.partition(":")
        if not sep or not preset or not model:
            raise SurgeError(
                f"--emulate takes PRESET:MODEL (got {spec!r}), e.g. "
                f"lambdascale-testbed1:llama2-13b; presets: {', '.join(cluster_presets())}; "
                f"models: {', '.join(model_names())}"
            )
        return EmulationConfig(preset, model, float(time_dilation))

    @property
    def spec(self) -> str:
        """`PRESET:MODEL`, as `parse` takes it."""
        return f"{self.preset}:{self.model}"

    @property
    def profile(self) -> ModelProfile:
        """The emulated model's shape and sizes."""
        return load_model(self.model)

    @property
    def num_gpus(self) -> int:
        """GPUs of the whole preset: the most agents it emulates (one agent per GPU)."""
        return load_cluster(self.preset).num_gpus
