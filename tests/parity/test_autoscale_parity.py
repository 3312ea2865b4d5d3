"""Autoscaling parity: the same pool history, seen through each body's observer
(`control/load_monitor.pool_load` for `surge serve`, `sim/scaling.pool_load` for the
simulator), gives the same `policy.autoscale` decisions tick by tick — stable window,
panic window, downscale delay and the last instance's keep-alive included, and FlexPipe's
always-ready floor (§9.1: a fraction of the pool's peak) with the peak forgotten after a
long idle stretch (`forget_peak_after_idle_s`: the idle pool goes to zero)."""

from dataclasses import dataclass, replace
from types import SimpleNamespace

from surge.control.load_monitor import pool_load as runtime_pool_load
from surge.policy.autoscale import AutoscaleState, ScaleDecision, decide
from surge.policy.autoscale_settings import AutoscaleSettings
from surge.sim.pools import Pool
from surge.sim.request import SimRequest
from surge.sim.scaling import pool_load as sim_pool_load

SETTINGS = AutoscaleSettings(
    target_ongoing_requests=4,
    upscale_delay_s=0.3,
    downscale_delay_s=2.0,
    keep_alive_s=10.0,
    panic_window_s=1.0,
    panic_threshold=2.0,
)


@dataclass(frozen=True)
class Inst:
    """One instance at one moment: its id, outstanding requests, loading, idle since."""

    iid: int
    outstanding: int = 0
    loading: bool = False
    idle_since_s: float | None = None
    sending: bool = False
    """A GPU source of a multicast now."""


@dataclass(frozen=True)
class Moment:
    now_s: float
    instances: tuple[Inst, ...]
    at_router: int = 0
    on_pipelines: int = 0


HISTORY = (
    Moment(0.0, (), at_router=3),  # at zero: the activator scales out at once
    Moment(0.1, (Inst(1, loading=True),), at_router=12),  # 12 >= 2 x 4 x 1: panic
    Moment(0.2, (Inst(1, 4), Inst(2, loading=True), Inst(3, loading=True)), 2, 2),
    # Panic is over at 1.1 s: wanting 4 now waits for the stable window.
    Moment(1.2, (Inst(1, 4), Inst(2, 4), Inst(3, 4)), 4),
    Moment(1.35, (Inst(1, 4), Inst(2, 4), Inst(3, 4)), 4),
    Moment(1.6, (Inst(1, 4), Inst(2, 4), Inst(3, 4)), 4),  # 0.4 s later: scale out
    # Instance 3 has idled past the delay but sends its copy to a new one: it stays.
    Moment(2.8, (Inst(1, 0, False, 1.5), Inst(3, 0, False, 0.5, sending=True))),
    Moment(3.0, (Inst(1, 0, False, 0.8), Inst(2, 0, False, 2.5), Inst(3, 0, False, 0.5))),
    Moment(5.0, (Inst(2, 0, False, 2.5),)),
    Moment(12.6, (Inst(2, 0, False, 2.5),)),  # idle 10.1 s: the last one goes
)


def _runtime_view(m: Moment):
    done = SimpleNamespace(is_set=lambda: False)
    instances = {
        i.iid: SimpleNamespace(
            node=i.iid,
            endpoint=None if i.loading else SimpleNamespace(outstanding=i.outstanding),
            idle_since_s=i.idle_since_s,
            num_sending=int(i.sending),
        )
        for i in m.instances
    }
    waiting = m.at_router + m.on_pipelines + sum(i.outstanding for i in m.instances)
    requests = {f"r{k}": SimpleNamespace(done=done) for k in range(waiting)}
    return runtime_pool_load(SimpleNamespace(instances=instances, requests=requests), m.now_s)


def _sim_view(m: Moment):
    pool = Pool(0, 0, "both")
    pool.instances = [  # type: ignore[list-item]
        SimpleNamespace(
            id=i.iid,
            outstanding=i.outstanding,
            reserved=0,
            loaded=not i.loading,
            sending=int(i.sending),
            idle_since_s=i.idle_since_s,
        )
        for i in m.instances
    ]
    pool.pipelines = [SimpleNamespace(outstanding=m.on_pipelines)]  # type: ignore[list-item]
    pool.queue.extend(SimRequest(-1 - r, 0, 0.0, 1, 1) for r in range(m.at_router))
    return sim_pool_load(pool, m.now_s)


def _decisions(
    view, settings: AutoscaleSettings = SETTINGS, history: tuple[Moment, ...] = HISTORY
) -> list[ScaleDecision]:
    state, out = AutoscaleState(), []
    for m in history:
        d = decide(view(m), settings, state)
        state = d.state
        out.append(d)
    return out


def test_both_bodies_observe_and_decide_alike() -> None:
    for m in HISTORY:
        assert _runtime_view(m) == _sim_view(m), m
    runtime, sim = _decisions(_runtime_view), _decisions(_sim_view)
    assert runtime == sim
    # The rules really fired (a history that exercised none would prove nothing).
    outs = [d.scale_out for d in runtime]
    assert outs[0] == 1 and outs[1] == 2  # activator, then panic
    assert outs[3] == outs[4] == 0 and outs[5] == 1  # the stable window held, then fired
    assert runtime[6].release == ()  # 1 has not idled 2 s yet; 3 sends
    assert runtime[7].release == (3, 1)  # longest idle first, the last one stays
    assert runtime[8].release == () and runtime[9].release == (2,)  # keep_alive_s


def test_both_bodies_keep_the_always_ready_floor_alike() -> None:
    """Half the peak (3 instances at 1.2 s) always ready: ceil(1.5) = 2 are kept."""
    floor = replace(SETTINGS, always_ready_fraction=0.5)
    runtime, sim = _decisions(_runtime_view, floor), _decisions(_sim_view, floor)
    assert runtime == sim
    assert runtime[3].state.peak_instances == 3
    assert runtime[7].release == (3,)  # 3 idle, 2 kept: only the longest idle goes
    assert runtime[9].release == () and runtime[9].desired == 2  # never to zero


IDLE = (
    Moment(0.0, (Inst(1, 4), Inst(2, 4), Inst(3, 4))),  # the peak: 3
    Moment(1.0, (Inst(1, 0, False, 0.5), Inst(2, 0, False, 0.8), Inst(3, 0, False, 0.9))),
    Moment(3.0, (Inst(1, 0, False, 0.5), Inst(2, 0, False, 0.8), Inst(3, 0, False, 0.9))),
    Moment(30.0, (Inst(2, 0, False, 0.8), Inst(3, 0, False, 0.9))),  # idle 29.1 s of 30
    Moment(31.0, (Inst(2, 0, False, 0.8), Inst(3, 0, False, 0.9))),  # 30.1 s: forgotten
    Moment(32.0, ()),
    Moment(40.0, (), at_router=1),  # load again: at zero, a new peak
    Moment(40.1, (Inst(4, loading=True),), at_router=1),
)


def test_both_bodies_forget_the_peak_of_an_idle_pool_alike() -> None:
    """Half the peak always ready, forgotten after 30 idle seconds: both bodies see the
    pool idle since its last instance went idle (0.9 s), hold 2 until 30.9 s, then release
    both and go to zero."""
    lapse = replace(SETTINGS, always_ready_fraction=0.5, forget_peak_after_idle_s=30.0)
    for m in IDLE:
        assert _runtime_view(m) == _sim_view(m), m
    runtime = _decisions(_runtime_view, lapse, IDLE)
    assert runtime == _decisions(_sim_view, lapse, IDLE)
    assert runtime[2].release == (1,) and runtime[2].desired == 2  # the floor holds 2
    assert runtime[3].release == () and runtime[3].wake_at_s == 30.9  # until the lapse
    assert runtime[4].release == (2, 3) and runtime[4].state.peak_instances == 0
    assert runtime[5].desired == 0 and runtime[6].scale_out == 1
    assert runtime[7].state.peak_instances == 1
    # kept for the pool's life (None), the floor never lets the pool reach zero
    never = _decisions(_runtime_view, replace(lapse, forget_peak_after_idle_s=None), IDLE)
    assert never[4].release == () and never[5].desired == 2
