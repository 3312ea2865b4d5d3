"""BlitzScale's load monitor (§5.3: "KVCache usage") parity: under GPU-time emulation
`surge serve` measures an instance's KV use against the emulated GPU's KV capacity for the
emulated model, the one the simulator's instances have (`policy.placement.kv_capacity_tokens`),
so both bodies weigh the same held tokens alike and `policy.autoscale` decides alike.

The runtime divided by its `EngineConfig` default, 16,384 tokens (the emulated A800 with
Llama-2 7B holds 119,180): on the emulated BlitzScale Fig. 17 +network run (b7371bb) the look
at 1.30 s read a prefill instance holding 8 prompts of 1,024 tokens and a decode instance
holding two as 0.63 of an instance's KV cache, asked for ceil(3.31 + 0.78) = 5 instances
where the simulator asked for 4, and scaled out a third time (node 4 at 1.301 s) where the
simulator did not."""

from pathlib import Path
from types import SimpleNamespace

from surge.config import EngineConfig
from surge.control.emulation import instance_costs, serving_estimates
from surge.control.load_monitor import LoadMonitor
from surge.control.load_monitor import pool_load as runtime_pool_load
from surge.control.settings import ControllerConfig
from surge.emulation import Emulation, EmulationConfig
from surge.policy.autoscale import decide
from surge.policy.blitzscale.monitor import profiled
from surge.policy.slo import Slo
from surge.policy.systems import system_config
from surge.sim.hardware import load_cluster
from surge.sim.instance_factory import kv_capacity_tokens
from surge.sim.models import load_model
from surge.sim.pools import Pool
from surge.sim.scaling import pool_load as sim_pool_load
from surge.sim.settings import SimSettings
from tests.control.scripted import bare_autoscaler

SLO = Slo(ttft_s=0.45, tpot_s=0.15)  # BlitzScale §3, Llama2-7B
ENGINE = EngineConfig(max_prefill_tokens=4096, max_num_seqs=8)  # the Fig. 17 emulation's
REAL_MODEL_BYTES = 12_665_344  # the Fig. 17 emulation's tiny Llama (16 layers)
REAL_KV_BYTES_PER_TOKEN = 8192  # its K/V per token: 2 x 16 layers x 2 heads x 32 x 4 bytes


def _emulation() -> Emulation:
    config = EmulationConfig.parse("blitzscale-a-hosts:llama2-7b", 40.0)
    return Emulation(config, REAL_MODEL_BYTES, REAL_KV_BYTES_PER_TOKEN)


def _sim_capacity() -> int:
    """KV tokens of one simulated instance of Llama-2 7B on the preset's GPU (one GPU, as
    `sim/instance_factory.InstanceFactory.make` sizes it)."""
    gpu = load_cluster("blitzscale-a-hosts").groups[0].gpu
    settings = SimSettings("blitzscale-a-hosts", ("llama2-7b",), "blitzscale")
    mem = gpu.memory_bytes * settings.kv_memory_fraction
    return kv_capacity_tokens(mem, load_model("llama2-7b"))


def _runtime_view(kv_tokens: int, prefill: list[int], decode: list[int], router: int):
    """`surge serve`'s load: node 0 prefills (its requests: no first token), node 1 decodes
    (requests with a first token and `decode` tokens each, prompt + output), `router` prompt
    tokens waiting at the router."""
    done = SimpleNamespace(is_set=lambda: False)
    requests: dict = {}

    def req(prompt: int, first: float | None):
        r = SimpleNamespace(
            done=done, prompt_token_ids=[0] * prompt, output_token_ids=[], first_token_t=first
        )
        requests[f"r{len(requests)}"] = r
        return r

    eps = {}
    for node, held, first in ((0, prefill, None), (1, decode, 1.0)):
        mine = {f"n{node}r{i}": req(p, first) for i, p in enumerate(held)}
        eps[node] = SimpleNamespace(
            name=f"i{node}", outstanding=len(mine), requests=mine, num_tokens=0
        )
    req(router, None)
    dep = SimpleNamespace(
        instances={
            n: SimpleNamespace(node=n, endpoint=ep, idle_since_s=None, num_sending=0)
            for n, ep in eps.items()
        },
        requests=requests,
    )
    return runtime_pool_load(dep, 1.3, LoadMonitor(), kv_tokens)


def test_the_monitor_measures_kv_use_against_the_emulated_instance_as_the_simulator(
    tmp_path: Path,
) -> None:
    emu = _emulation()
    capacity = _sim_capacity()
    assert capacity == 119_180
    autoscaler = bare_autoscaler(ControllerConfig(tmp_path, emulation=emu))
    assert autoscaler.kv_tokens == capacity  # was EngineConfig().max_kv_tokens, 16,384
    # Without emulation, the engine's own capacity (unchanged)
    assert bare_autoscaler(ControllerConfig(tmp_path)).kv_tokens == EngineConfig().max_kv_tokens

    # A decoding instance holding the same tokens reads the same KV use in both bodies.
    held = 2 * (1024 + 10)
    runtime = _runtime_view(autoscaler.kv_tokens, [], [1034, 1034], 0)
    pool = Pool(0, 0, "both")
    pool.instances.append(
        SimpleNamespace(  # type: ignore[arg-type]
            id=1,
            outstanding=2,
            reserved=0,
            loaded=True,
            sending=0,
            idle_since_s=None,
            pending_prompt_tokens=0,
            decode_tokens_per_s=0.0,
            kv_tokens=held,
            kv_capacity_tokens=capacity,
            monitor_reads=lambda: (None, 0.0, held),  # idle since, tokens/s, KV tokens
        )
    )
    sim = sim_pool_load(pool, 1.3, monitor=True)
    assert runtime.instances[1].kv_usage == sim.instances[0].kv_usage == held / capacity


def test_the_fig17_look_at_1_30_s_asks_for_the_simulators_instances(tmp_path: Path) -> None:
    """The emulated +network look at 1.301 s: 17,885 prompt tokens without a first token
    (8 x 1,024 on the prefill instance, the rest at the router), two requests of 1,024 + ~10
    tokens decoding; the simulator's look at 1.3 s asked for 4 (two serving, two loading:
    no scale-out)."""
    emu = _emulation()
    costs = instance_costs(emu, serving_estimates(emu), REAL_MODEL_BYTES, ENGINE)
    spec = system_config("blitzscale").autoscale
    settings = profiled(spec, costs, SLO)
    autoscaler = bare_autoscaler(ControllerConfig(tmp_path, emulation=emu))
    view = _runtime_view(autoscaler.kv_tokens, [1024] * 8, [1034, 1034], 17_885 - 8 * 1024)
    assert view.pending_prefill_tokens == 17_885
    assert settings.target_prefill_tokens_per_s is not None
    assert round(settings.target_prefill_tokens_per_s) == 12021  # the simulator's bound
    assert decide(view, settings).desired == 4
    old = _runtime_view(EngineConfig().max_kv_tokens, [1024] * 8, [1034, 1034], 17_885 - 8192)
    assert decide(old, settings).desired == 5  # the third scale-out the simulator had not
