"""Shared fakes for parity tests: the same scenario, described once, built in each body."""

import asyncio
from dataclasses import dataclass


@dataclass(frozen=True)
class EndpointSpec:
    """One endpoint of a scenario, in the order it came up (oldest first)."""

    name: str
    outstanding: int
    capacity: int
    speed: float = 1.0
    target: float | None = None
    num_stages: int = 1


class FakeClient:
    """Just enough of `ClusterClient` for a `Server`: subscriptions that never fire."""

    def __init__(self) -> None:
        self.down: set[int] = set()

    def subscribe(self, event_types: tuple[type, ...], model: str | None = None) -> asyncio.Queue:
        return asyncio.Queue()

    def unsubscribe(self, q: asyncio.Queue) -> None:
        pass
