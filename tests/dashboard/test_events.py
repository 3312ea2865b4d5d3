"""The event bus and the timeline format (`surge/events.py`): nothing queued without a
subscriber, a slow subscriber drops its own overflow only, every event type round-trips
through JSON, and a bad timeline file is one clear error."""

import asyncio
import json
from dataclasses import fields

import pytest

from surge.errors import SurgeError
from surge.events import (
    EVENT_TYPES,
    BlockLanded,
    EventBus,
    PipelineOpened,
    Recorder,
    Timeline,
    TimelineEvent,
)


def _example(cls: type[TimelineEvent]) -> TimelineEvent:
    """An instance of `cls` with a value of the right type in every field."""
    values = {int: 3, float: 1.5, str: "m", bool: True, tuple[int, ...]: (1, 2)}
    kw = {}
    for f in fields(cls):
        if f.name == "t_s":
            continue
        t = f.type
        if t == tuple[tuple[int, int, int], ...]:
            kw[f.name] = ((0, 0, 2), (1, 2, 4))
        elif t == tuple[tuple[int, int], ...]:
            kw[f.name] = ((0, 2), (2, 4))
        elif t == float | None:
            kw[f.name] = 0.25
        else:
            kw[f.name] = values[t]
    return cls(t_s=2.0, **kw)


@pytest.mark.parametrize("name", sorted(EVENT_TYPES))
def test_every_event_type_round_trips_through_json(name: str) -> None:
    ev = _example(EVENT_TYPES[name])
    text = json.dumps(ev.to_json())
    back = TimelineEvent.decode(json.loads(text))
    assert back == ev
    assert back.to_json()["type"] == name


def test_the_types_other_helpers_publish_exist() -> None:
    for name in ("refactor", "pd_role", "handoff", "mutation", "pipeline", "mode", "live_batch"):
        assert name in EVENT_TYPES


def test_no_subscriber_nothing_is_kept_and_times_are_stamped() -> None:
    bus = EventBus()
    ev = BlockLanded(model="m", node=0, block=1, tier="gpu")
    bus.publish(ev)
    assert not bus.active and ev.t_s == 0.0  # not even stamped: nobody listened

    async def run() -> None:
        sub = bus.subscribe()
        assert bus.active
        bus.publish(BlockLanded(model="m", node=0, block=2, tier="gpu"))
        got = sub.queue.get_nowait()
        assert got.t_s > 0 and got.block == 2
        bus.unsubscribe(sub)
        assert not bus.active

    asyncio.run(run())


def test_a_slow_subscriber_drops_its_own_overflow_only() -> None:
    async def run() -> None:
        bus = EventBus(max_queue=4)
        slow, fast = bus.subscribe(), bus.subscribe()
        got = []
        for b in range(10):
            bus.publish(BlockLanded(model="m", node=0, block=b, tier="gpu"))
            got.append(fast.queue.get_nowait().block)
        assert got == list(range(10))
        assert slow.queue.qsize() == 4 and slow.num_dropped == 6
        assert [slow.queue.get_nowait().block for _ in range(4)] == [0, 1, 2, 3]

    asyncio.run(run())


def test_timeline_file_round_trip_and_bad_files(tmp_path) -> None:
    rec = Recorder()
    rec.publish(PipelineOpened(t_s=1.0, model="m", name="p", stages=((0, 0, 2), (1, 2, 4))))
    rec.publish(BlockLanded(t_s=0.5, model="m", node=1, block=0, tier="host"))
    path = tmp_path / "t.json"
    rec.timeline("test").write(path)
    back = Timeline.read(path)
    assert back.source == "test" and back.events == tuple(rec.events)
    with pytest.raises(SurgeError, match="does not exist"):
        Timeline.read(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(SurgeError, match="not JSON"):
        Timeline.read(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"events": []}')
    with pytest.raises(SurgeError, match="not a surge timeline"):
        Timeline.read(tmp_path / "other.json")
    data = json.loads(path.read_text())
    data["events"][0]["type"] = "nonsense"
    with pytest.raises(SurgeError, match="unknown timeline event 'nonsense'"):
        Timeline.from_json(data)
    del data["events"][1]["block"]
    data["events"][0]["type"] = "pipeline"
    with pytest.raises(SurgeError, match=r"missing field 'block'"):
        Timeline.from_json(data)
    # Each field is checked against its type, as the agent protocol's are (a file that
    # says a node is "x" used to load and break the dashboard's page instead).
    data["events"][1]["block"], data["events"][1]["node"] = 0, "x"
    with pytest.raises(SurgeError, match=r"field 'node' must be an integer"):
        Timeline.from_json(data)
