"""Event loop: explicit tie-break and cancellation."""

from surge.sim.events import EventLoop, Priority


def test_same_time_orders_by_priority_then_key_not_creation():
    loop = EventLoop()
    seen: list[str] = []
    # created in the "wrong" order on purpose
    loop.schedule(1.0, Priority.SAMPLE, 0, lambda: seen.append("sample"))
    loop.schedule(1.0, Priority.ARRIVAL, 7, lambda: seen.append("arrival7"))
    loop.schedule(1.0, Priority.ARRIVAL, 3, lambda: seen.append("arrival3"))
    loop.schedule(1.0, Priority.FLOW, 9, lambda: seen.append("flow"))
    loop.schedule(0.5, Priority.SAMPLE, 0, lambda: seen.append("early"))
    loop.run()
    assert seen == ["early", "flow", "arrival3", "arrival7", "sample"]


def test_same_entity_same_class_runs_in_creation_order():
    loop = EventLoop()
    seen: list[int] = []
    for i in range(5):
        loop.schedule(2.0, Priority.INSTANCE, 1, lambda i=i: seen.append(i))
    loop.run()
    assert seen == [0, 1, 2, 3, 4]


def test_cancel_and_until_and_past_times_clamped():
    loop = EventLoop()
    seen: list[str] = []
    ev = loop.schedule(1.0, Priority.FLOW, 0, lambda: seen.append("cancelled"))
    ev.cancel()

    def later() -> None:
        seen.append("later")
        loop.schedule(0.0, Priority.FLOW, 0, lambda: seen.append(f"past@{loop.now_s}"))

    loop.schedule(2.0, Priority.FLOW, 0, later)
    loop.schedule(5.0, Priority.FLOW, 0, lambda: seen.append("beyond"))
    loop.run(until_s=3.0)
    assert seen == ["later", "past@2.0"]
    assert loop.now_s == 2.0
