"""The event loop: a heap of timed callbacks with an explicit, total tie-break.

In: `schedule(time_s, priority, key, handler)` calls. Out: handlers run in order of
(time_s, priority, key, seq):
- `time_s`: virtual seconds;
- `priority`: the event class (`Priority`): at one instant, data arriving (flows) is
  handled before instances step, before new requests arrive, before the autoscaler
  looks, before samplers record, so every observer sees the instant's final state;
- `key`: a stable id of the entity the event belongs to (request, instance, flow id),
  so simultaneous events of one class run in entity order, not in the order they
  happened to be created (Vidur orders equal-time events by creation only, which makes
  results depend on incidental call order);
- `seq`: creation order, only to break what is left (same entity, same class, same time).
Events are cancelled lazily (`Event.cancel`); nothing here reads a clock or draws a
random number, so one seed gives byte-identical results.
"""

import heapq
import itertools
from collections.abc import Callable
from enum import IntEnum


class Priority(IntEnum):
    """Order of event classes at the same virtual instant (lower runs first)."""

    FLOW = 0
    """A transfer finished or changed rate."""
    INSTANCE = 1
    """An instance finished a prefill or a decode completion, or changed state."""
    ARRIVAL = 2
    """A request arrives."""
    CONTROL = 3
    """Autoscaler and keep-alive decisions."""
    SAMPLE = 4
    """Metric samplers."""


class Event:
    """A scheduled callback; `cancel()` keeps it from running."""

    __slots__ = ("cancelled", "handler", "time_s")

    def __init__(self, time_s: float, handler: Callable[[], None]) -> None:
        self.time_s = time_s
        self.handler = handler
        self.cancelled = False

    def cancel(self) -> None:
        """Do not run this event."""
        self.cancelled = True


class EventLoop:
    """Virtual time and the event heap."""

    def __init__(self) -> None:
        self.now_s = 0.0
        """Current virtual time in seconds."""
        self.num_events = 0
        """Events run so far."""
        self._heap: list[tuple[float, int, int, int, Event]] = []
        self._seq = itertools.count()

    def schedule(
        self, time_s: float, priority: Priority, key: int, handler: Callable[[], None]
    ) -> Event:
        """Run `handler` at `time_s` (never before now)."""
        if time_s < self.now_s:
            time_s = self.now_s
        event = Event(time_s, handler)
        heapq.heappush(self._heap, (time_s, priority, key, next(self._seq), event))
        return event

    def run(
        self, until_s: float = float("inf"), on_progress: Callable[[float], None] | None = None
    ):
        """Run events up to `until_s` (inclusive); `on_progress(now)` every 4096 events."""
        heap = self._heap
        pop = heapq.heappop
        while heap and heap[0][0] <= until_s:
            time_s, _, _, _, event = pop(heap)
            if event.cancelled:
                continue
            self.now_s = time_s
            self.num_events += 1
            event.handler()
            if on_progress is not None and not self.num_events & 4095:
                on_progress(time_s)

    @property
    def pending(self) -> int:
        """Events still in the heap (cancelled ones included)."""
        return len(self._heap)
