"""A sender's egress port serves pulls in plan order: lowest step first, also when the
pulls wake together (a block lands that several peers wait for) and when one is cancelled."""

import asyncio

import pytest

from surge.runtime.node.transfer import EgressPort


async def _pull(port: EgressPort, held: asyncio.Event, step: float, order: list[float]) -> None:
    await held.wait()
    async with port.slot(step):
        order.append(step)
        await asyncio.sleep(0.001)  # the send


def test_pulls_woken_together_are_served_lowest_step_first() -> None:
    async def run() -> list[float]:
        port, held, order = EgressPort(), asyncio.Event(), []
        # the later steps' peers asked first: wake-up order is 3, 2, 1
        tasks = [asyncio.create_task(_pull(port, held, s, order)) for s in (3.0, 2.0, 1.0)]
        await asyncio.sleep(0.01)
        held.set()
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(run()) == [1.0, 2.0, 3.0]


def test_a_cancelled_pull_gives_the_port_back() -> None:
    async def run() -> list[float]:
        port, order = EgressPort(), []
        gate = asyncio.Event()

        async def hold(step: float) -> None:
            async with port.slot(step):
                order.append(step)
                await gate.wait()

        first = asyncio.create_task(hold(1.0))
        await asyncio.sleep(0.01)
        waiting = asyncio.create_task(hold(2.0))
        last = asyncio.create_task(hold(3.0))
        await asyncio.sleep(0.01)
        waiting.cancel()  # cancelled while queued
        gate.set()
        await first
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await asyncio.wait_for(last, 1.0)  # the port was not lost
        return order

    assert asyncio.run(run()) == [1.0, 3.0]
