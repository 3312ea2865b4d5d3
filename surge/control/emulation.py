"""GPU-time emulation seen from the control plane: its clock, and the agents' paced-step counts.

What flows: at start, the controller's `ControllerConfig.emulation` in, its one `Clock` out
(`control_clock`: the central hook where the time dilation D reaches the control plane; every
collaborator and each deployment's `Server` read time from it) and the compute and fetch
rates its scale-outs assume (`serving_estimates`). On a `/metrics` scrape, each
live agent's `StatusReply` (its paced steps and violations, `surge.emulation.pacing`) in; the
per-node counters `surge_emulation_steps_total` and `surge_emulation_violations_total`
(`control/metrics.py`) out, raised by what each agent counted since the last scrape. Owned by
control/; called by the controller's facade.
"""

import asyncio
import logging

from surge.config import EngineConfig
from surge.control.metrics import Metrics
from surge.control.settings import ControllerConfig
from surge.control.spec import DeploymentSpec
from surge.emulation import Emulation, traffic_charges
from surge.errors import SurgeError
from surge.model.manifest import Manifest
from surge.policy.blitzscale.monitor import InstanceCosts, StepProfile, profile_costs
from surge.policy.placement import KV_MEMORY_FRACTION, kv_capacity_tokens
from surge.runtime.client import ClusterClient
from surge.runtime.clock import REAL_CLOCK, Clock
from surge.runtime.launch.agent_process import local_agent_threads
from surge.runtime.protocol import StatusOp
from surge.runtime.scaleout.estimates import HOST_ESTIMATES, ServingEstimates
from surge.runtime.step_profiles import profile_in_child
from surge.sim.costs import cost_model, monitor_costs
from surge.sim.hardware import gpu_profile

log = logging.getLogger(__name__)

STATUS_TIMEOUT_S = 2.0
"""A scrape waits this long for an agent's counts (a busy or dead agent is skipped)."""


def control_clock(emulation: Emulation | None) -> Clock:
    """The control plane's clock: under GPU-time emulation it runs D times slower than the
    host's (an emulated second lasts D real ones), so the autoscaler's tick and windows,
    keep-alives, hold timeouts, SLOs and every system's windows keep their emulated
    values and act at the emulated cluster's pace (docs/emulation.md "Clock"); else the
    host's clock. The agents' heartbeats (`control/healing.py`) stay on the host's clock:
    they watch real processes."""
    if emulation is None:
        return REAL_CLOCK
    return Clock(emulation.config.time_dilation)


ESTIMATE_PROMPT_TOKENS = 32
"""The short prompt whose prefill `ServingEstimates.prefill_over_decode` stands for (as the
FlexPipe stage profile's, `scaleout/flexpipe.PROFILE_TOKENS`)."""


def serving_estimates(emulation: Emulation | None) -> ServingEstimates:
    """The compute and fetch rates the scale-outs assume before measuring: under GPU-time
    emulation the emulated cluster's, in emulated seconds for the real store (its first
    GPU's cost model for the emulated model, `sim/costs.py`: a decode step's weight read, a
    short prompt's prefill over it; its registry link, PCIe and SSD scaled by the store's
    bytes ratio),
    so ParaServe's Alg. 1 and FlexPipe's profile and load time weigh what the emulated
    cluster would (the host's own compute and links are not the emulated ones); else the
    host's rules of thumb."""
    if emulation is None:
        return HOST_ESTIMATES
    node = emulation.nodes(1)[0]
    cost = cost_model(emulation.config.profile, gpu_profile(node.gpu))
    decode_s = cost.decode_s(1)
    return ServingEstimates(
        weight_read_bytes_per_s=emulation.real_model_bytes / decode_s,
        prefill_over_decode=cost.prefill_s(ESTIMATE_PROMPT_TOKENS) / decode_s,
        fetch_gbps=node.registry_gbps * emulation.scale.weights_ratio,
        host_gbps=node.pcie_gbps * emulation.scale.weights_ratio,
        disk_gbps=node.ssd_gbps * emulation.scale.weights_ratio,
    )


async def deployment_profile(
    config: ControllerConfig, engine: EngineConfig, spec: DeploymentSpec, manifest: Manifest
) -> StepProfile | None:
    """The real engine's step profile of a deployment's model (BlitzScale §5.3: "profiling
    ... offline"), kept under `config.step_profile_dir` or taken now in a child process
    (`runtime/step_profiles.profile_in_child`: seconds once the decode graphs are in
    inductor's cache, minutes on a busy CPU without them; its progress in the log), when its
    load monitor profiles its bounds and its agents run unemulated (emulation has its own
    cost model, `instance_costs`); else None. The profile is taken on this machine's device,
    the agents' under `surge serve`'s local launcher, on one local agent's threads
    (`local_agent_threads`: its share of the cores). One that cannot be taken or kept is a
    warning: the host's estimates size the bounds."""
    directory = config.step_profile_dir
    if directory is None or config.emulation is not None or not spec.autoscaling.profile_bounds:
        return None
    if manifest.root is None:
        return None
    try:
        threads = local_agent_threads(config.nodes)
        return await profile_in_child(manifest.root, engine, directory, _progress, threads)
    except SurgeError as e:  # a deployment serves on: its bounds stay the estimates
        log.warning("%s: no step profile (%s): its monitor's bounds are estimated", spec.name, e)
        return None


def _progress(line: str) -> None:
    """The child's log line (`LEVEL message`) in this log: its first and last lines and its
    warnings at `surge serve`'s default level (a deployment's bounds change when it is
    done), the rest (each size measured) at INFO."""
    level, _, msg = line.partition(" ")
    shown = level != "INFO" or msg.startswith(("profiling ", "profiled "))
    log.log(logging.WARNING if shown else logging.INFO, "step profile: %s", msg or line)


def instance_costs(
    emulation: Emulation | None,
    estimates: ServingEstimates,
    store_bytes: int,
    engine: EngineConfig,
    profile: StepProfile | None = None,
) -> InstanceCosts:
    """One instance's step costs for the load monitor's profile (BlitzScale §5.3,
    `policy.blitzscale.monitor`), in the serving clock's seconds: under GPU-time emulation
    the emulated GPU's cost model for the emulated model (the simulator's, `sim/costs.py`);
    else the real engine's measured steps where they were profiled (`profile`,
    `deployment_profile`; `policy.blitzscale.monitor.profile_costs`); else the host's
    estimates: a prefill costs `prefill_over_decode` decode steps per
    `ESTIMATE_PROMPT_TOKENS` prompt tokens (a CPU's prefill is compute-bound: linear in its
    tokens); a one-sequence decode step reads every weight once (`ServingEstimates.decode_s`)
    and each further sequence in the step costs one token's compute, the prefill's per
    token (the simulator's cost model has the same form: `decode_per_seq_s` is the
    per-token compute). On a CPU that compute, not the weight read, dominates a batched
    step: measured on SmolLM2-135M here (`benchmarks.engine.monitor_host_bound`, one
    thread) a decode step took 50 ms at batch 1 and 242 ms at 64, 3.0 ms per sequence as a
    prompt token's 3.0 ms of prefill, where a batch-free step put the decode bound at all
    64 sequences, 4.3x the tokens/s one instance makes within the TBT SLO. The engine's
    step limits either way."""
    if emulation is not None:
        gpu = gpu_profile(emulation.nodes(1)[0].gpu)
        return monitor_costs(
            emulation.config.profile, gpu, 1, engine.max_prefill_tokens, engine.max_num_seqs
        )
    if profile is not None:
        return profile_costs(profile, engine.max_prefill_tokens, engine.max_num_seqs)
    step_s = estimates.decode_s(store_bytes)
    per_token_s = estimates.prefill_over_decode * step_s / ESTIMATE_PROMPT_TOKENS

    def prefill_s(tokens: int) -> float:
        return tokens * per_token_s

    def decode_s(batch: int) -> float:
        return step_s + (batch - 1) * per_token_s

    return InstanceCosts(prefill_s, decode_s, engine.max_prefill_tokens, engine.max_num_seqs)


def monitor_kv_tokens(emulation: Emulation | None, engine: EngineConfig) -> int:
    """The KV tokens of one instance the load monitor measures KV use against (BlitzScale
    §5.3: "KVCache usage"; `control/load_monitor.kv_usage`, `PdServing`'s view): under
    GPU-time emulation the emulated GPU's for the emulated model, as the simulator's
    instances hold (`policy.placement.kv_capacity_tokens` at its `KV_MEMORY_FRACTION`);
    else the engine's `max_kv_tokens`. It was `max_kv_tokens` under emulation too, the
    controller's default 16,384 (the agents' engines hold 32,768 there, clipped by the
    real model's KV budget; the emulated A800 with 7B ~119,000): on the emulated BlitzScale
    Fig. 17 +network run a prefill instance with 8 prompts of 1,024 tokens and a decode
    instance with two read as 0.63 of an instance's KV cache (the simulator 0.07), the
    monitor asked for ceil(3.31 + 0.78) = 5 instances at 1.30 s where the simulator asked
    for 4, and a third scale-out ran that the simulator did not."""
    if emulation is None:
        return engine.max_kv_tokens
    model = emulation.config.profile
    node = emulation.nodes(1)[0]
    return kv_capacity_tokens(
        node.memory_bytes * KV_MEMORY_FRACTION, model.total_bytes, model.kv_bytes_per_token
    )


def kv_pace(emulation: Emulation | None, manifest: Manifest) -> float:
    """How K/V the controller sends (P/D hand-offs) is paced: under GPU-time emulation at
    the K/V's own real / emulated byte ratio (`surge.emulation.traffic_charges`; the links
    are scaled for the weights'), else as its bytes."""
    if emulation is None:
        return 1.0
    return traffic_charges(emulation.config.profile, manifest).kv


class EmulationCounts:
    """The last counts seen per node, so the counters rise by what is new."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[int, int]] = {}

    async def refresh(self, metrics: Metrics, client: ClusterClient, nodes: list[int]) -> None:
        """Ask every node in `nodes` for its counts; raise the counters by the increase."""

        async def one(node: int) -> None:
            try:
                async with asyncio.timeout(STATUS_TIMEOUT_S):
                    st = await client.call(node, StatusOp())
            except Exception as e:  # a scrape must answer even while a node is away
                log.debug("emulation counts of node %d: %s", node, e)
                return
            steps, bad = self.seen.get(node, (0, 0))
            label = str(node)
            metrics.emulation_steps.labels(label).inc(max(0, st.emulated_steps - steps))
            metrics.emulation_violations.labels(label).inc(max(0, st.emulation_violations - bad))
            self.seen[node] = (st.emulated_steps, st.emulation_violations)

        await asyncio.gather(*(one(n) for n in nodes))
