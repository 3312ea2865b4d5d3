"""Streaming text equals the whole decode, stop strings cut exactly, and detokenizing a
2,000-token answer costs O(n): the ids decoded per token do not grow with position
(defect 9: the old API re-decoded the whole output on every token)."""

import asyncio
import random
import time

import pytest

from surge.api.streaming import IncrementalDetokenizer, RequestStream, StopCutter
from surge.engine.sampling import SamplingParams
from surge.model.tokenizer import build_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(400)


class Counting:
    """A tokenizer that records how many ids each decode call got."""

    def __init__(self, tok) -> None:
        self.tok, self.sizes = tok, []

    def decode(self, ids):
        self.sizes.append(len(ids))
        return self.tok.decode(ids)


def _ids(tok, n: int, seed: int = 0) -> list[int]:
    text = "héllo wörld, ünïcode ✓ 日本語 and the quick brown fox jumps. "
    ids = tok.encode(text * (n // 10 + 1)).ids
    rng = random.Random(seed)
    ids += [rng.randrange(2, tok.get_vocab_size()) for _ in range(n // 4)]  # odd byte runs
    return ids[:n]


def test_incremental_text_equals_the_whole_decode(tok) -> None:
    for seed in range(5):
        ids = _ids(tok, 300, seed)
        d = IncrementalDetokenizer(tok)
        text = "".join(d.push([t]) for t in ids[:-1]) + d.push(ids[-1:], final=True)
        assert text == tok.decode(ids)
        d = IncrementalDetokenizer(tok)  # in uneven batches
        parts, i = [], 0
        while i < len(ids):
            k = random.Random(i).randint(1, 7)
            parts.append(d.push(ids[i : i + k], final=i + k >= len(ids)))
            i += k
        assert "".join(parts) == tok.decode(ids)


def test_per_token_cost_does_not_grow_with_position(tok) -> None:
    ids = _ids(tok, 2000)
    counting = Counting(tok)
    d = IncrementalDetokenizer(counting)
    per_token: list[int] = []
    times: list[float] = []
    for t in ids:
        before = len(counting.sizes)
        t0 = time.perf_counter()
        d.push([t])
        times.append(time.perf_counter() - t0)
        per_token.append(sum(counting.sizes[before:]))
    total = sum(per_token)
    print(f"ids decoded for 2000 tokens: {total} ({total / 2000:.1f}/token); "
          f"max window {max(counting.sizes)}; "
          f"time/token at 100: {sum(times[50:150]) / 100 * 1e6:.1f} us, "
          f"at 1900: {sum(times[1850:1950]) / 100 * 1e6:.1f} us")  # fmt: skip
    assert total < 20 * len(ids), "decoding must be O(n) overall"
    assert max(counting.sizes) < 20, "each decode sees a short window, not the whole output"
    early, late = sum(per_token[50:150]), sum(per_token[1850:1950])
    assert late <= 2 * early + 50, (early, late)
    # The old way (whole output per token) would have decoded ~n²/2 ids.
    assert total < len(ids) ** 2 / 2 / 50


def test_stop_cutter_holds_back_a_possible_stop_start() -> None:
    c = StopCutter(["STOP"])
    assert c.push("abcST", False) == ("ab", False)  # "cST" may begin STOP
    assert c.push("O", False) == ("c", False)  # only 3 characters are held
    assert c.push("Px", False) == ("", True)
    c = StopCutter(["zz"])
    assert c.push("az", False) == ("a", False)
    assert c.push("b", True) == ("zb", False)
    assert StopCutter([]).push("abc", False) == ("abc", False)


class FakeRequest:
    """What a `RequestStream` reads of a `TrackedRequest`."""

    def __init__(self) -> None:
        self.output_token_ids: list[int] = []
        self.progress, self.done = asyncio.Event(), asyncio.Event()
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.params = SamplingParams()

    def add(self, ids: list[int], reason: str | None = None) -> None:
        self.output_token_ids += ids
        if reason:
            self.finish_reason = reason
            self.done.set()
        self.progress.set()

    def finish(self, reason: str) -> None:
        self.finish_reason = reason
        self.done.set()


def test_request_stream_cuts_at_a_stop_string_and_ends_the_request(tok) -> None:
    ids = tok.encode("one, two, three, four").ids

    async def run():
        req = FakeRequest()
        stream = RequestStream(req, tok, ["three"])
        out = []

        async def feed():
            for t in ids:
                if req.done.is_set():
                    return
                req.add([t])
                await asyncio.sleep(0)
            req.add([], "length")

        task = asyncio.ensure_future(feed())
        async for d in stream.deltas():
            out.append(d)
        await task
        return req, out

    req, out = asyncio.run(run())
    assert "".join(d.text for d in out) == "one, two, "
    assert out[-1].finish_reason == "stop" and req.finish_reason == "stop_string"


def test_a_failed_request_ends_the_stream_with_its_reason(tok) -> None:
    from surge.errors import Unavailable

    async def run():
        req = FakeRequest()
        req.error, req.finish_reason = "seed must be between", "error"
        req.done.set()  # an endpoint failed it: only `done` is set
        return [d async for d in RequestStream(req, tok, []).deltas()]

    with pytest.raises(Unavailable, match="seed"):
        asyncio.run(asyncio.wait_for(run(), 5))


def test_merged_ticks_while_held_and_hands_every_request_back(tok) -> None:
    from surge.api.streaming import merged

    async def run():
        held, quick = FakeRequest(), FakeRequest()
        streams = [RequestStream(held, tok, []), RequestStream(quick, tok, [])]
        finished: list[str] = []
        out = []

        async def later():
            quick.add(tok.encode("hi").ids, "stop")
            await asyncio.sleep(0.25)  # held, as for a scale-out from zero
            held.add(tok.encode("yo").ids, "length")

        task = asyncio.ensure_future(later())
        async for i, d in merged(streams, lambda r, st: finished.append(st), 0.05):
            out.append((i, d))
        await task
        return out, finished

    out, finished = asyncio.run(run())
    ticks = [x for x in out if x[1] is None]
    assert len(ticks) >= 2 and all(i == -1 for i, _ in ticks)
    texts = {i: d.text for i, d in out if d is not None}
    assert texts == {0: "yo", 1: "hi"} and finished == ["ok", "ok"]


def test_a_refused_request_raises_the_controllers_error(tok) -> None:
    from surge.api.streaming import merged
    from surge.errors import Unavailable

    async def run():
        req = FakeRequest()
        req.exception = Unavailable("held past hold_timeout_s", retry_after_s=3)
        req.finish("error")
        finished: list[str] = []
        with pytest.raises(Unavailable) as e:
            async for _ in merged([RequestStream(req, tok, [])], lambda r, s: finished.append(s)):
                pass
        return e.value, finished

    err, finished = asyncio.run(run())
    assert err.retry_after_s == 3 and finished == ["error"]


def test_hand_back_covers_streams_never_iterated(tok) -> None:
    from surge.api.streaming import hand_back, merged

    async def run():
        a, b = FakeRequest(), FakeRequest()
        a.add([5], "stop")
        streams = [RequestStream(a, tok, []), RequestStream(b, tok, [])]
        got: list[tuple[object, str]] = []
        it = merged(streams[:1], lambda r, s: got.append((r, s)))
        async for _ in it:
            pass
        hand_back(streams, lambda r, s: got.append((r, s)))  # b was never streamed
        hand_back(streams, lambda r, s: got.append((r, s)))  # idempotent
        return a, b, got

    a, b, got = asyncio.run(run())
    assert got == [(a, "ok"), (b, "cancelled")]


class _Endless:
    """A stream whose deltas never end and are always ready: the consumer of `merged` is
    cancelled while a delta is in hand, the race that Python 3.11's `asyncio.wait_for`
    lost (it returned the delta and dropped the cancellation)."""

    class _Req:
        finish_reason = None

    def __init__(self) -> None:
        self.req = self._Req()
        self.handed_back = False

    async def deltas(self):
        from surge.api.streaming import Delta

        n = 0
        while True:
            n += 1
            yield Delta("x", None, n - 1, n)
            await asyncio.sleep(0)


def test_a_cancelled_consumer_of_merged_always_stops() -> None:
    """A client gone mid-stream cancels the task feeding it; the cancellation must never be
    swallowed (a CI run once streamed 16 x 2,000 tokens to a closed socket because of it)."""
    from surge.api.streaming import merged

    async def once(after: int) -> list[str]:
        finished: list[str] = []

        async def consume() -> None:
            async for _ in merged([_Endless(), _Endless()], lambda r, s: finished.append(s), 5):
                pass

        task = asyncio.ensure_future(consume())
        for _ in range(after):
            await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=2.0)
        assert done, f"cancelled after {after} loop turns, the stream went on"
        assert task.cancelled()
        return finished

    async def main() -> None:
        for after in range(1, 80):
            assert await once(after) == ["cancelled", "cancelled"]

    asyncio.run(main())
