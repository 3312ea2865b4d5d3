"""The autoscaler's state file (`control/autoscale_memory.py`), without agents: written as
wall-clock times and read back into another process's monotonic clock (emulated seconds
too), replaced atomically, and a corrupt, other-version or unreadable file is a warning and
an empty start, never an error; a version-1 file (one time per deployment) is read with one
warning; per-instance times come back onto adopted instances."""

import asyncio
import json
import logging
from types import SimpleNamespace

from surge.config import EngineConfig
from surge.control.adoption import Adopter
from surge.control.autoscale_memory import VERSION, AutoscaleMemory
from surge.model.manifest import read_manifest
from surge.policy.adoption import AdoptPipeline
from surge.policy.autoscale import AutoscaleState, InstanceLoad, PoolLoad, decide
from surge.policy.autoscale_restart import Carried, Restart
from surge.policy.autoscale_settings import AutoscaleSettings
from surge.runtime.clock import Clock


def _clock(now_real_s: float, dilation: float = 1.0) -> Clock:
    return Clock(dilation, monotonic=lambda: now_real_s)


def _dep(state: AutoscaleState) -> SimpleNamespace:
    """What the memory reads of a deployment: no instance, no request, its state."""
    return SimpleNamespace(failure=None, instances={}, requests={}, autoscale_state=state)


def test_times_cross_processes_as_wall_clock(tmp_path):
    path = tmp_path / "autoscale.json"
    # the old process: monotonic 1000 s, Unix time 1.8e9; the pool quiet for 40 s
    old = AutoscaleMemory(path, _clock(1000.0), wall=lambda: 1.8e9)
    old.restore({})
    # its instance on node 0 quiet for 100 s, on node 1 for 40 s
    state = AutoscaleState(peak_instances=3, restart=Restart(960.0, 2, ((0, 900.0), (1, 960.0))))
    asyncio.run(old.save({"m": _dep(state)}))
    doc = json.loads(path.read_text())
    assert doc["version"] == VERSION == 2
    assert doc["deployments"]["m"] == {
        "peak_instances": 3,
        "held_instances": 2,
        "quiet_since_wall_s": 1.8e9 - 40.0,
        "instances": {"0": 1.8e9 - 100.0, "1": 1.8e9 - 40.0},
    }
    # the new one, 30 s later by the wall, its monotonic clock at 7 s: quiet for 70 s
    new = AutoscaleMemory(path, _clock(7.0), wall=lambda: 1.8e9 + 30.0)
    each = ((0, 7.0 - 130.0), (1, 7.0 - 70.0))
    assert new.load() == {"m": Carried(3, Restart(7.0 - 70.0, 2, each))}
    # under GPU-time emulation (an emulated second lasts 40 real ones): 70 s are 1.75 s
    emulated = AutoscaleMemory(path, _clock(400.0, 40.0), wall=lambda: 1.8e9 + 30.0)
    assert emulated.load()["m"].restart.quiet_since_s == 10.0 - 1.75
    # a wall clock set back: the quiet time is now, never in the future
    back = AutoscaleMemory(path, _clock(7.0), wall=lambda: 1.8e9 - 3600.0)
    assert back.load()["m"].restart.quiet_since_s == 7.0
    assert [p.name for p in tmp_path.iterdir()] == ["autoscale.json"]  # no temporary left


def test_restore_gives_named_deployments_their_state(tmp_path):
    path = tmp_path / "autoscale.json"
    first = AutoscaleMemory(path, _clock(100.0), wall=lambda: 5000.0)
    first.restore({})
    asyncio.run(first.save({"a": _dep(AutoscaleState(peak_instances=1, restart=Restart(90.0, 1)))}))
    a, b = _dep(AutoscaleState()), _dep(AutoscaleState())
    second = AutoscaleMemory(path, _clock(0.0), wall=lambda: 5000.0)
    second.restore({"a": a, "b": b})
    assert a.autoscale_state == AutoscaleState(peak_instances=1, restart=Restart(-10.0, 1))
    assert b.autoscale_state == AutoscaleState()
    # nothing changed: no write; a deletion is written at once
    mtime = path.stat().st_mtime_ns
    asyncio.run(second.save({"a": a, "b": b}))
    assert path.stat().st_mtime_ns == mtime
    asyncio.run(second.save({"b": b}))
    assert json.loads(path.read_text())["deployments"] == {}


def test_bad_files_are_a_warning_and_an_empty_start(tmp_path, caplog):
    path = tmp_path / "autoscale.json"
    memory = AutoscaleMemory(path, _clock(0.0), wall=lambda: 100.0)
    assert memory.load() == {}  # missing: a first start, nothing to say
    good = {"peak_instances": 1, "held_instances": 1, "quiet_since_wall_s": 90.0}
    cases = {
        "{not json": "is not valid",
        "[1, 2]": "is of version None",
        json.dumps({"version": 0, "deployments": {}}): "is of version 0",
        json.dumps({"version": VERSION, "deployments": []}): "is not valid",
        json.dumps({"version": VERSION, "written_at_wall_s": 1.0}): "is not valid",
    }
    for text, why in cases.items():
        path.write_text(text)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert memory.load() == {}, text
        assert why in caplog.text and "no autoscaler state" in caplog.text, (text, caplog.text)
    path.write_bytes(b"\xff\xfe\x00")
    with caplog.at_level(logging.WARNING):
        assert memory.load() == {}
    # one bad record is skipped, the others kept
    bad = {**good, "held_instances": -1}
    nan = {**good, "quiet_since_wall_s": float("nan")}  # json writes NaN, and reads it
    doc = {"version": VERSION, "written_at_wall_s": 100.0, "deployments": {"a": good, "b": bad}}
    doc["deployments"]["c"] = nan
    path.write_text(json.dumps(doc))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert memory.load() == {"a": Carried(1, Restart(-10.0, 1))}
    assert "'b'" in caplog.text and "'c'" in caplog.text


def test_a_version_1_file_is_read_with_one_warning(tmp_path, caplog):
    """The file before per-instance times: each instance quiet since its deployment's time."""
    path = tmp_path / "autoscale.json"
    v1 = {"peak_instances": 2, "held_instances": 2, "quiet_since_wall_s": 90.0}
    doc = {"version": 1, "written_at_wall_s": 95.0, "deployments": {"a": v1, "b": v1}}
    path.write_text(json.dumps(doc))
    memory = AutoscaleMemory(path, _clock(0.0), wall=lambda: 100.0)
    a = _dep(AutoscaleState())
    with caplog.at_level(logging.WARNING):
        memory.restore({"a": a})
    assert caplog.text.count("is of version 1") == 1, caplog.text
    assert "since its deployment's last request" in caplog.text
    assert a.autoscale_state.restart == Restart(-10.0, 2)
    assert a.autoscale_state.restart.quiet_for([0, 1]) == {0: -10.0, 1: -10.0}


def _restarted_on_two_idle_nodes(tmp_path, peak_instances: int) -> AutoscaleMemory:
    """The state file of an old controller whose deployment `m` had node 0 idle since 700
    and node 1 since 950, and the memory of a new one started at once after it (a new
    clock: -300 and -50 s in it)."""
    path = tmp_path / "autoscale.json"
    old = AutoscaleMemory(path, _clock(1000.0), wall=lambda: 5000.0)
    old.restore({})
    dep = _dep(AutoscaleState(peak_instances=peak_instances))
    dep.instances = {
        n: SimpleNamespace(node=n, endpoint=SimpleNamespace(outstanding=0), num_sending=0,
                           idle_since_s=t)
        for n, t in ((0, 700.0), (1, 950.0))
    }  # fmt: skip
    asyncio.run(old.save({"m": dep}))
    return AutoscaleMemory(path, _clock(0.0), wall=lambda: 5000.0)


def test_adopted_instances_get_their_own_idle_times(tmp_path):
    """Two instances last used at different times, the controller restarted: each adopted
    instance idles since its own last request (`Adopter.settle`), so `decide` releases each
    on its own schedule; before per-instance times both idled since the later one."""
    new = _restarted_on_two_idle_nodes(tmp_path, peak_instances=2)
    m = _dep(AutoscaleState())
    adopter = Adopter(None, None, 1, EngineConfig(), _clock(0.0), lambda d: None)
    m.instances = {
        n: SimpleNamespace(endpoint=SimpleNamespace(outstanding=0), idle_since_s=0.0)
        for n in (0, 1)
    }
    adopter.adopted = [("m", 0), ("m", 1)]
    new.restore({"m": m})
    adopter.settle({"m": m})
    assert {n: i.idle_since_s for n, i in m.instances.items()} == {0: -300.0, 1: -50.0}
    settings = AutoscaleSettings(downscale_delay_s=300.0, keep_alive_s=900.0)
    load = PoolLoad(
        0.0, 0, tuple(InstanceLoad(n, 0, False, i.idle_since_s) for n, i in m.instances.items())
    )
    d = decide(load, settings, m.autoscale_state)
    assert d.release == (0,)  # idle 300 s: released now, not 250 s later
    assert d.wake_at_s == -50.0 + 900.0  # the other at its own keep-alive


def test_a_pipeline_adopted_before_the_state_is_restored_gets_its_carried_idle_time(
    tmp_path, tiny_store_dir
):
    """An adopted pipeline's head engines wait for no import now: it can be up before the
    autoscaler state is restored (`Controller.start`), and `settle` then gives each member
    the idle time carried for its node, as a local instance's (not the restart's)."""
    new = _restarted_on_two_idle_nodes(tmp_path, peak_instances=1)
    adopter = Adopter(None, None, 1, EngineConfig(), _clock(0.0), lambda d: None)
    m = _dep(AutoscaleState())
    m.name, m.manifest, m.host_last_used_s = "m", read_manifest(tiny_store_dir), {}
    m.spec = SimpleNamespace(system=SimpleNamespace(group_sizing="lambdascale"))
    layers = m.manifest.arch.num_layers

    async def adopt_then_restore() -> None:
        spawned: list[asyncio.Task] = []
        added = []

        async def add_endpoint(ep) -> None:
            added.append(ep)

        m.spawn = lambda coro: spawned.append(asyncio.get_running_loop().create_task(coro))
        m.server = SimpleNamespace(add_endpoint=add_endpoint)
        pipe = AdoptPipeline("m", "m-pipe", ((0, 0, 1), (1, 1, layers)))
        await adopter.adopt(m, (pipe,))
        await asyncio.gather(*spawned)
        assert added and all(i.endpoint is added[0] for i in m.instances.values())
        new.restore({"m": m})
        adopter.settle({"m": m})
        for g in added[0].groups:
            g.task.cancel()

    asyncio.run(adopt_then_restore())
    assert {n: i.idle_since_s for n, i in m.instances.items()} == {0: -300.0, 1: -50.0}


def test_a_failing_write_is_one_warning(tmp_path, caplog):
    path = tmp_path / "missing-dir" / "autoscale.json"
    memory = AutoscaleMemory(path, _clock(0.0), wall=lambda: 100.0)
    memory.restore({})
    dep = _dep(AutoscaleState(peak_instances=1, restart=Restart(0.0, 1)))
    with caplog.at_level(logging.WARNING):
        asyncio.run(memory.save({"a": dep}))
        asyncio.run(memory.save({"a": dep}))
    assert caplog.text.count("cannot write the autoscaler state") == 1
