"""Token buckets: per-node egress and ingress bandwidth caps.

Each agent owns one bucket per direction; every chunk sent or received consumes tokens
first, so N agents on one machine behave like N machines with N NICs of a chosen speed.
Consumers go into debt and sleep it off, so concurrent flows share the rate fairly in
aggregate without a queue. Background consumers (`background=True`: ParaServe §4.2's
parameter prefetch, `policy.paraserve.prefetch.BACKGROUND`) never go into debt: they take
only the tokens the others leave, so a foreground packet never waits behind their bytes.
"""

import asyncio
import threading
import time


def gbps_to_bytes_per_s(gbps: float) -> float:
    return gbps * 1e9 / 8


class TokenBucket:
    """A rate limit of `rate_bytes_per_s` with a burst of `burst_bytes` (None rate: unlimited)."""

    def __init__(self, rate_bytes_per_s: float | None, burst_bytes: int | None = None) -> None:
        if rate_bytes_per_s is not None and rate_bytes_per_s <= 0:
            raise ValueError("rate must be > 0 bytes/s (None for unlimited)")
        self.rate = rate_bytes_per_s
        # A small burst (10 ms of traffic, at least 64 KiB) keeps the cap tight.
        self.burst = (
            burst_bytes
            if burst_bytes is not None
            else (int(max(64 * 1024, (rate_bytes_per_s or 0) * 0.01)))
        )
        self._tokens = float(self.burst)
        self._last = time.monotonic()
        self._lock = threading.Lock()  # the loop and reader threads share a bucket

    @property
    def unlimited(self) -> bool:
        return self.rate is None

    def chunk_bytes(self) -> int:
        """A chunk size that paces smoothly at this rate (<= 10 ms of traffic, <= 1 MiB)."""
        if self.rate is None:
            return 1 << 20
        return int(min(1 << 20, max(16 * 1024, self.rate * 0.01)))

    def _take(self, num_bytes: int) -> float:
        """Take tokens now; return how long to sleep to pay off any debt."""
        assert self.rate is not None
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= num_bytes
            return -self._tokens / self.rate if self._tokens < 0 else 0.0

    def refund(self, num_bytes: int) -> None:
        """Give back tokens taken for bytes that did not move."""
        if self.rate is not None:
            with self._lock:
                self._tokens = min(self.burst, self._tokens + num_bytes)

    def _take_left(self, num_bytes: int) -> tuple[int, float]:
        """Background: take up to `num_bytes` of the tokens held now, never into debt;
        (bytes taken, how long to sleep before trying again when none were)."""
        assert self.rate is not None
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            if self._tokens <= 0:  # foreground debt is paid off first
                return 0, -self._tokens / self.rate + 0.001
            taken = int(min(num_bytes, self._tokens))
            self._tokens -= taken
            return taken, 0.0

    async def consume(self, num_bytes: int, background: bool = False) -> None:
        """Wait until `num_bytes` may pass."""
        if self.rate is None or num_bytes <= 0:
            return
        if background:
            while num_bytes > 0:
                taken, delay = self._take_left(num_bytes)
                num_bytes -= taken
                if num_bytes > 0:
                    await asyncio.sleep(delay or min(num_bytes, self.burst) / self.rate)
            return
        delay = self._take(num_bytes)
        if delay > 0:
            await asyncio.sleep(delay)

    def consume_blocking(
        self, num_bytes: int, background: bool = False, stop: threading.Event | None = None
    ) -> None:
        """`consume` for threads (disk and remote reads). With `stop`, a wait ends as soon
        as it is set (an aborted load: the caller checks it and gives up)."""
        if self.rate is None or num_bytes <= 0:
            return
        sleep = time.sleep if stop is None else stop.wait
        if background:
            while num_bytes > 0 and not (stop is not None and stop.is_set()):
                taken, delay = self._take_left(num_bytes)
                num_bytes -= taken
                if num_bytes > 0:
                    sleep(delay or min(num_bytes, self.burst) / self.rate)
            return
        delay = self._take(num_bytes)
        if delay > 0:
            sleep(delay)
