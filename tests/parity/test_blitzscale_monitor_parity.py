"""BlitzScale's load monitor (§5.3) parity: `surge serve` and the simulator profile the same
per-instance bounds for one model on one GPU (the runtime under GPU-time emulation from the
emulated GPU's cost model, `control/emulation.instance_costs`; the simulator from its own,
`Simulation._instance_costs`; both through `sim/costs.monitor_costs`), measure the same
prefill load (prompt tokens of the requests without a first token: at the router, waiting,
prefilling; not the ones decoding) and so take the same `policy.autoscale` decisions."""

from types import SimpleNamespace

import numpy as np
import pytest

from surge.config import EngineConfig
from surge.control.emulation import instance_costs, serving_estimates
from surge.control.load_monitor import LoadMonitor
from surge.control.load_monitor import pool_load as runtime_pool_load
from surge.emulation import Emulation, EmulationConfig
from surge.policy.autoscale import decide
from surge.policy.blitzscale.monitor import bounds, profiled
from surge.policy.slo import Slo
from surge.policy.systems import system_config
from surge.sim.pools import Pool
from surge.sim.request import SimRequest
from surge.sim.scaling import pool_load as sim_pool_load
from surge.sim.settings import SimSettings
from surge.sim.simulator import Simulation
from surge.traces.request import Trace

SLO = Slo(ttft_s=0.45, tpot_s=0.15)  # BlitzScale §3, Llama2-7B
ENGINE = EngineConfig(max_prefill_tokens=4096, max_num_seqs=64)

# (instance id, prompts waiting, prompts prefilling, prompts decoding) and the router's
MOMENTS = (
    ((), (), 9000),  # at zero: 9,000 prompt tokens at the router
    (((1, (3000, 2500), (2000,), (100,) * 12),), (4000,), 0),
    (((1, (), (), (100,) * 30), (2, (1200,), (), (200,) * 5)), (), 0),
)


def _costs():
    emu = Emulation(EmulationConfig.parse("paraserve-1:llama2-7b", 40.0), 8_000_000)
    runtime = instance_costs(emu, serving_estimates(emu), 8_000_000, ENGINE)
    trace = Trace("none", np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64))
    settings = SimSettings(
        "paraserve-1",
        ("llama2-7b",),
        "blitzscale",
        slo=SLO,
        max_prefill_tokens=ENGINE.max_prefill_tokens,
        max_batch=ENGINE.max_num_seqs,
    )
    sim = Simulation(trace, settings)._instance_costs(0)
    return runtime, sim


def _runtime_view(instances, at_router, router_tokens):
    done = SimpleNamespace(is_set=lambda: False)
    requests, eps = {}, {}
    for iid, waiting, prefilling, decoding in instances:
        reqs = {}
        for prompt, first in [(p, None) for p in (*waiting, *prefilling)] + [
            (p, 1.0) for p in decoding
        ]:
            r = SimpleNamespace(done=done, prompt_token_ids=[0] * prompt, first_token_t=first)
            reqs[f"r{len(requests)}"] = r
            requests[f"r{len(requests)}"] = r
        eps[iid] = SimpleNamespace(name=f"i{iid}", outstanding=len(reqs), requests={}, num_tokens=0)
    for p in (*at_router, *((router_tokens,) if router_tokens else ())):
        requests[f"r{len(requests)}"] = SimpleNamespace(
            done=done, prompt_token_ids=[0] * p, first_token_t=None
        )
    dep = SimpleNamespace(
        instances={
            iid: SimpleNamespace(node=iid, endpoint=ep, idle_since_s=None, num_sending=0)
            for iid, ep in eps.items()
        },
        requests=requests,
    )
    return runtime_pool_load(dep, 1.0, LoadMonitor(), max_kv_tokens=0)


def _sim_view(instances, at_router, router_tokens):
    rid = iter(range(10_000))

    def req(prompt: int, first: bool) -> SimRequest:
        r = SimRequest(next(rid), 0, 0.0, prompt, 4)
        r.first_token_s = 0.5 if first else -1.0
        return r

    pool = Pool(0, 0, "both")
    for iid, waiting, prefilling, decoding in instances:
        pool.instances.append(
            SimpleNamespace(  # type: ignore[arg-type]
                id=iid,
                outstanding=len(waiting) + len(prefilling) + len(decoding),
                reserved=0,
                loaded=True,
                sending=0,
                idle_since_s=None,
                pending_prompt_tokens=sum((*waiting, *prefilling)),  # none has a first token
                decode_tokens_per_s=0.0,
                kv_tokens=0,
                kv_capacity_tokens=0,
                monitor_reads=lambda: (None, 0.0, 0),  # idle since, tokens/s, KV tokens
            )
        )
    prompts = (*at_router, *((router_tokens,) if router_tokens else ()))
    pool.queue.extend(req(p, False) for p in prompts)
    return sim_pool_load(pool, 1.0, monitor=True)


def test_both_bodies_profile_measure_and_decide_alike() -> None:
    runtime_costs, sim_costs = _costs()
    assert bounds(runtime_costs, SLO) == bounds(sim_costs, SLO)
    base = system_config("blitzscale").autoscale
    settings = profiled(base, runtime_costs, SLO)
    assert settings == profiled(base, sim_costs, SLO)
    within = settings.target_prefill_tokens_per_s * SLO.ttft_s  # prompt tokens per instance
    for instances, at_router, router_tokens in MOMENTS:
        runtime = _runtime_view(instances, at_router, router_tokens)
        sim = _sim_view(instances, at_router, router_tokens)
        assert runtime == sim
        want = decide(runtime, settings).desired
        assert want == decide(sim, settings).desired
        assert want == max(1, int(np.ceil(runtime.pending_prefill_tokens / within)))
    # The prefill load really is the prompts without a first token (decoding ones excluded).
    assert _sim_view(*MOMENTS[1]).pending_prefill_tokens == 3000 + 2500 + 2000 + 4000
    assert _sim_view(*MOMENTS[2]).pending_prefill_tokens == pytest.approx(1200)
