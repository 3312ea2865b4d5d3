"""`surge serve`'s controller sizes a blitzscale deployment's load monitor by its engine's step
profile (BlitzScale §5.3, "profiled offline"), end to end on real agents: a profile kept by
`surge model profile` is read when the deployment starts and nothing is measured (the two
agree on every key, the CPU threads of one local agent among them); a model
with none serves at once on the host's estimates while its profile is taken in the
background (a child process), and its bounds switch to the profile when it is done."""

import asyncio
import json
import time
from pathlib import Path

import pytest

from surge.control.controller import Controller, ControllerConfig
from surge.control.emulation import instance_costs
from surge.control.state import Deployment
from surge.engine.sampling import SamplingParams
from surge.model.importer import import_checkpoint
from surge.policy.blitzscale.monitor import StepProfile, bounds, profile_costs
from surge.runtime.launch.agent_process import local_agent_threads
from surge.runtime.launch.local import LocalCluster, LocalClusterConfig
from surge.runtime.scaleout.estimates import HOST_ESTIMATES
from surge.runtime.step_profiles import parse_profile
from tests.conftest import run_surge

FAKE = StepProfile(((32, 0.01), (512, 0.2)), ((1, 0.02), (2, 0.03)))
"""Written into the kept file: only a read of it gives these steps."""
NODES = 2
"""Agents: each computes on half this machine's cores, not torch's default (all of them)."""
WAIT_S = 180.0
"""Longest wait for a profile (a child that imports torch and times a tiny engine)."""


async def profile_of(dep: Deployment) -> StepProfile:
    start_s = time.monotonic()
    while dep.step_profile is None:
        assert time.monotonic() - start_s < WAIT_S, f"{dep.name}: no step profile"
        await asyncio.sleep(0.05)
    return dep.step_profile


def decode_bound(c: Controller, dep: Deployment, profile: StepProfile | None) -> float:
    """The monitor's decode bound from `profile`, else from the host's estimates."""
    e, size = c.engine, dep.manifest.total_bytes
    costs = (
        profile_costs(profile, e.max_prefill_tokens, e.max_num_seqs)
        if profile is not None
        else instance_costs(None, HOST_ESTIMATES, size, e)
    )
    return bounds(costs, dep.spec.slo.seconds()).decode_tokens_per_s


def test_a_kept_profile_is_read_at_start_a_missing_one_taken_in_the_background(
    tiny_store: Path, tiny_hf: Path, tmp_path: Path
) -> None:
    profiles = tmp_path / "profiles"
    r = run_surge(
        "model", "profile", str(tiny_store), "--no-compile-decode", "--max-num-seqs", "2",
        "--nodes", str(NODES), "--profile-dir", str(profiles),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    [kept] = profiles.glob("*.json")
    body = json.loads(kept.read_text())
    assert body["key"]["device"].endswith(f":{local_agent_threads(NODES)}threads")
    body["prefill_s"], body["decode_s"] = FAKE.prefill_s, FAKE.decode_s
    kept.write_text(json.dumps(body))
    stamp = kept.stat().st_mtime_ns
    other = tmp_path / "other"  # the same weights in 2 blocks: another model digest
    import_checkpoint(tiny_hf, other, num_blocks=2, progress=False)
    state = tmp_path / "state"
    (state / "registry").mkdir(parents=True)
    config = ControllerConfig(
        state_dir=state,
        nodes=NODES,
        max_num_seqs=2,
        compile_decode=False,
        step_profile_dir=profiles,
    )
    gate = asyncio.Event()

    async def run() -> None:
        cluster = LocalClusterConfig(num_nodes=NODES, remote_dir=state / "registry")
        with LocalCluster(cluster) as lc:
            c = Controller(config, lc.addresses, lc.token)
            await c.start()
            taken = c._w.deployments.step_profile

            async def held(spec, manifest):  # the background profile waits for the test
                if spec.name == "later":
                    await gate.wait()
                return await taken(spec, manifest)

            c._w.deployments.step_profile = held
            try:
                blitz = {"strategy": "blitzscale"}
                first = await c.create({"name": "first", "model": str(tiny_store), **blitz})
                assert await profile_of(first) == FAKE  # read, not measured
                assert sorted(profiles.glob("*.json")) == [kept]
                assert kept.stat().st_mtime_ns == stamp
                got = c.autoscale_settings(first).target_tokens_per_s
                assert got == pytest.approx(decode_bound(c, first, FAKE))

                later = await c.create({"name": "later", "model": str(other), **blitz})
                params = SamplingParams(max_tokens=4, ignore_eos=True)
                req = await c.submit(later, [1, 2, 3], params)
                await asyncio.wait_for(req.done.wait(), 120)
                assert req.first_token_t is not None  # served while its profile is taken
                assert later.step_profile is None
                estimated = c.autoscale_settings(later).target_tokens_per_s
                assert estimated == pytest.approx(decode_bound(c, later, None))
                gate.set()
                measured = await profile_of(later)
                [new] = set(profiles.glob("*.json")) - {kept}
                assert measured == parse_profile(new.read_text())  # measured and kept
                switched = c.autoscale_settings(later).target_tokens_per_s
                assert switched == pytest.approx(decode_bound(c, later, measured))
                assert switched != pytest.approx(estimated)
            finally:
                await c.stop()

    asyncio.run(run())
