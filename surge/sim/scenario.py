"""Multi-model scenarios: M models of mixed sizes on one cluster, each with its arrivals.

In: a scenario JSON file, or the name of a bundled one (`profiles/scenarios/NAME.json`,
one per paper evaluation). Out: a validated `Scenario` (frozen), from which
`scenario_traffic.build_trace` makes the merged trace and `Scenario.settings` /
`Scenario.system` the `SimSettings` and `SystemConfig` of each system's run. Every bad
field raises `SurgeError` naming the field and the fix (the CLI prints one `error:` line).

Shape (units in names):
    {"name": "...", "doc": "...",
     "cluster": "PRESET" | "file.json" | {"preset": "PRESET", "num_nodes": 12,
                 "host_memory_gib": 256, "gpus_per_node": 1, ...node-group fields},
     "models": [{"name": "code", "profile": "llama2-13b", "count": 4,
                 "arrivals": {"trace": "azure-code", "split": "zipf", "zipf_s": 1.0,
                              "share": 1.0, "rate_scale": 1.0, "start_s": 0.0}}, ...],
     "duration_s": 1800, "systems": ["lambdascale", "serverlessllm"],
     "system_overrides": {"serverlessllm": {"keep_alive_s": 60, "host_cache_fraction": 0.2}},
     "slo": {"ttft_s": 5.0, "tpot_s": 0.2}, "warm": 0, "seed": 0}
`split` says how a group's `count` models share its source's requests: `uniform`,
`round-robin`, `zipf` (Zipf(`zipf_s`) popularity, model 0 the most popular) or `trace`
(the source's own models: BurstGPT's `Model`, the Alibaba GenAI trace's base models,
ServeGen's clients, ranked busiest first; model i takes the trace's i-th, the rest are
dropped) or `each` (every model its own draw of a generator, seeds apart: per-model
Gamma processes, ParaServe §8.3's method). Host memory, GPUs per host and the host
cache's keep-alive and size (the LRU of `policy.copies.keepalive`) come from the cluster and
the system overrides.
"""

import copy
import json
from dataclasses import dataclass, replace
from pathlib import Path

from surge.errors import SurgeError
from surge.policy.slo import Slo
from surge.policy.systems import SystemConfig, system_config
from surge.sim.hardware import ClusterProfile, cluster_from_spec, cluster_spec, refuse_renamed
from surge.sim.models import load_model
from surge.sim.settings import SimSettings

SCENARIOS_DIR = Path(__file__).resolve().parent / "profiles" / "scenarios"
SPLITS = ("uniform", "round-robin", "zipf", "trace", "each")
GROUP_FIELDS = (
    "num_nodes",
    "gpus_per_node",
    "host_memory_gib",
    "disk_gb",
    "nic_gbps",
    "gpu_nic_gbps",
    "pcie_gbps",
    "ssd_gbps",
    "ssd_gpu_gbps",
    "registry_gbps",
    "intra_gpu_gbps",
    "model_store",
)
"""Node-group fields a scenario may override on every group of its cluster preset."""
OVERRIDABLE = (
    "keep_alive_s",
    "host_cache_fraction",
    "host_cache",
    "max_sources",
    "num_blocks",
    "init_s",
    "init_overlaps_load",
    "pipeline_size",
    "group_sizing",
    "consolidation",
)
"""`SystemConfig` fields a scenario may set per system."""
SIM_FIELDS = ("max_batch", "max_prefill_tokens", "kv_memory_fraction", "max_drain_s")
"""`SimSettings` fields a scenario may set (its `sim` object)."""


@dataclass(frozen=True)
class Arrivals:
    """Where one model group's requests come from."""

    trace: str
    """A `--trace` value (name, generator or file; files resolve under --traces-dir too)."""
    split: str = "uniform"
    """How the group's models share the requests (see module docstring)."""
    zipf_s: float = 1.0
    """Zipf exponent with `split="zipf"`."""
    share: float = 1.0
    """Fraction of the source's requests this group takes (a random subset)."""
    rate_scale: float = 1.0
    """Multiply the source's rate by this (arrival times divided)."""
    start_s: float = 0.0
    """Skip this much of the (scaled) source."""
    seed: int | None = None
    """Seed of a generated source (`gamma:`, `servegen:`); None: the scenario's seed plus
    the group's position, so two groups naming one generator get different arrivals."""


@dataclass(frozen=True)
class ModelGroup:
    """`count` models of one profile, named `name/0` .. `name/count-1`."""

    name: str
    profile: str
    """Model preset or JSON file (`surge.sim.models.load_model`)."""
    count: int
    arrivals: Arrivals
    slo: Slo | None = None
    """This group's SLO (ParaServe §8.3 Table 2: per application); None: the scenario's."""


@dataclass(frozen=True)
class Scenario:
    """A validated scenario (see module docstring)."""

    name: str
    doc: str
    cluster: ClusterProfile
    groups: tuple[ModelGroup, ...]
    duration_s: float | None
    systems: tuple[str, ...]
    overrides: tuple[tuple[str, tuple[tuple[str, object], ...]], ...]
    """(system, ((field, value), ...)) applied with `dataclasses.replace`."""
    slo: Slo
    warm: int
    seed: int
    sim: tuple[tuple[str, float], ...] = ()
    """`SimSettings` fields (SIM_FIELDS) of every run, e.g. ParaServe's batch of 8."""

    @property
    def model_names(self) -> tuple[str, ...]:
        """Distinct names of every model, in model-index order."""
        return tuple(f"{g.name}/{i}" for g in self.groups for i in range(g.count))

    def settings(self, system: str, **extra: object) -> SimSettings:
        """The `SimSettings` of `system`'s run of this scenario."""
        return SimSettings(
            self.cluster,
            tuple(f"{g.profile}*{g.count}" for g in self.groups),
            system,
            self.seed,
            self.slo,
            warm_instances=self.warm,
            model_names=self.model_names,
            model_slos=tuple(
                (f"{g.name}/{i}", g.slo) for g in self.groups if g.slo for i in range(g.count)
            ),
            **{**dict(self.sim), **extra},  # type: ignore[arg-type]
        )

    def system(self, name: str) -> SystemConfig:
        """`name`'s `SystemConfig` with this scenario's overrides."""
        cfg = system_config(name)
        for sys_name, fields in self.overrides:
            if sys_name == name:
                cfg = replace(cfg, **dict(fields))
        return cfg


def scenario_presets() -> tuple[str, ...]:
    """Names of the bundled scenarios."""
    return tuple(sorted(p.stem for p in SCENARIOS_DIR.glob("*.json")))


def load_scenario(name_or_file: str) -> Scenario:
    """A bundled scenario by name, or a scenario JSON file."""
    path = SCENARIOS_DIR / f"{name_or_file}.json"
    if not path.is_file():
        path = Path(name_or_file)
    if not path.is_file():
        raise SurgeError(
            f"unknown scenario {name_or_file!r}; give a JSON file or one of "
            f"{', '.join(scenario_presets())}"
        )
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, RecursionError) as e:  # RecursionError: nested too deep
        raise SurgeError(f"scenario file {path} is not valid JSON ({str(e)[:200]})") from None
    return parse_scenario(doc, str(path))


def _obj(value: object, where: str) -> dict:
    if not isinstance(value, dict):
        raise SurgeError(f"{where} must be a JSON object")
    return value


def _known(d: dict, allowed: tuple[str, ...], where: str) -> None:
    extra = sorted(set(d) - set(allowed))
    if extra:
        raise SurgeError(f"{where}: unknown field(s) {', '.join(extra)}; use {', '.join(allowed)}")


def _num(d: dict, key: str, default: float | None, where: str, low: float = 0.0) -> float:
    value = d.get(key, default)
    if value is None:
        raise SurgeError(f"{where}: field {key} is required")
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= low:
        raise SurgeError(f"{where}: {key} must be a number >= {low:g} (got {value!r})")
    return float(value)


def _cluster(value: object, where: str) -> ClusterProfile:
    if isinstance(value, str):
        return cluster_from_spec(value, cluster_spec(value))
    d = _obj(value, f"{where}.cluster")
    if "groups" in d:
        return cluster_from_spec(f"{where}.cluster", d)
    refuse_renamed(d, f"{where}.cluster")
    _known(d, ("preset", *GROUP_FIELDS), f"{where}.cluster")
    if not isinstance(d.get("preset"), str):
        raise SurgeError(f"{where}.cluster: give a preset name (or a full 'groups' list)")
    spec = copy.deepcopy(cluster_spec(d["preset"]))
    for group in spec.get("groups", []):
        group.update({k: v for k, v in d.items() if k != "preset"})
    return cluster_from_spec(f"{d['preset']}+overrides", spec)


def _arrivals(value: object, where: str) -> Arrivals:
    d = _obj(value, where)
    _known(d, ("trace", "split", "zipf_s", "share", "rate_scale", "start_s", "seed"), where)
    if not isinstance(d.get("trace"), str) or not d["trace"]:
        raise SurgeError(f"{where}: field trace is required (a --trace value)")
    split = d.get("split", "uniform")
    if split not in SPLITS:
        raise SurgeError(f"{where}: split must be one of {', '.join(SPLITS)} (got {split!r})")
    share = _num(d, "share", 1.0, where)
    if not 0 < share <= 1:
        raise SurgeError(f"{where}: share must be in (0, 1] (got {share})")
    rate = _num(d, "rate_scale", 1.0, where)
    if rate <= 0:
        raise SurgeError(f"{where}: rate_scale must be > 0 (got {rate})")
    return Arrivals(
        d["trace"],
        split,
        _num(d, "zipf_s", 1.0, where),
        share,
        rate,
        _num(d, "start_s", 0.0, where),
        None if d.get("seed") is None else int(_num(d, "seed", None, where)),
    )


def _group(value: object, where: str) -> ModelGroup:
    d = _obj(value, where)
    _known(d, ("name", "profile", "count", "arrivals", "slo"), where)
    name = d.get("name")
    if not isinstance(name, str) or not name or "/" in name:
        raise SurgeError(f"{where}: name must be a non-empty string without '/'")
    profile = d.get("profile")
    if not isinstance(profile, str):
        raise SurgeError(f"{where}: profile must be a model name (e.g. llama2-7b)")
    load_model(profile)
    count = d.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise SurgeError(f"{where}: count must be an integer >= 1 (got {count!r})")
    slo = None if d.get("slo") is None else _slo(d["slo"], f"{where}.slo")
    return ModelGroup(name, profile, count, _arrivals(d.get("arrivals"), f"{where}.arrivals"), slo)


def _slo(value: object, where: str) -> Slo:
    d = _obj(value, where)
    _known(d, ("ttft_s", "tpot_s"), where)
    return Slo(_num(d, "ttft_s", Slo.ttft_s, where), _num(d, "tpot_s", Slo.tpot_s, where))


def _overrides(value: object, where: str) -> tuple:
    out = []
    for sys_name, fields in sorted(_obj(value, where).items()):
        system_config(sys_name)
        f = _obj(fields, f"{where}.{sys_name}")
        _known(f, OVERRIDABLE, f"{where}.{sys_name}")
        try:
            replace(system_config(sys_name), **f)
        except (TypeError, SurgeError) as e:
            raise SurgeError(f"{where}.{sys_name}: {e}") from None
        out.append((sys_name, tuple(sorted(f.items()))))
    return tuple(out)


def parse_scenario(doc: object, where: str = "scenario") -> Scenario:
    """Validate a scenario document (the parsed JSON)."""
    d = _obj(doc, where)
    _known(
        d,
        (
            "name",
            "doc",
            "cluster",
            "models",
            "duration_s",
            "systems",
            "system_overrides",
            "slo",
            "warm",
            "seed",
            "sim",
        ),
        where,
    )
    sim = _obj(d.get("sim", {}), f"{where}.sim")
    _known(sim, SIM_FIELDS, f"{where}.sim")
    for key in sim:
        _num(sim, key, None, f"{where}.sim", 1e-9)
    sim_items = tuple(
        (k, int(v) if k in ("max_batch", "max_prefill_tokens") else float(v))
        for k, v in sorted(sim.items())
    )
    groups = d.get("models")
    if not isinstance(groups, list) or not groups:
        raise SurgeError(f"{where}: models must be a non-empty list of model groups")
    parsed = tuple(_group(g, f"{where}.models[{i}]") for i, g in enumerate(groups))
    if len({g.name for g in parsed}) != len(parsed):
        raise SurgeError(f"{where}: model group names must be distinct")
    systems = d.get("systems", ["lambdascale", "serverlessllm"])
    if not isinstance(systems, list) or not all(isinstance(s, str) for s in systems):
        raise SurgeError(f"{where}: systems must be a list of system names")
    for s in systems:
        system_config(s)
    duration = d.get("duration_s")
    warm, seed = d.get("warm", 0), d.get("seed", 0)
    for key, value in (("warm", warm), ("seed", seed)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SurgeError(f"{where}: {key} must be an integer >= 0 (got {value!r})")
    if "cluster" not in d:
        raise SurgeError(f"{where}: field cluster is required (a preset, file or object)")
    return Scenario(
        str(d.get("name", Path(where).stem)),
        str(d.get("doc", "")),
        _cluster(d["cluster"], where),
        parsed,
        None if duration is None else _num(d, "duration_s", None, where, 1e-9),
        tuple(systems),
        _overrides(d.get("system_overrides", {}), f"{where}.system_overrides"),
        _slo(d.get("slo", {}), f"{where}.slo"),
        warm,
        seed,
        sim_items,
    )
