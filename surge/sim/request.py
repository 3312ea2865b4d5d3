"""A request in flight through the simulated cluster.

In: one trace row. Out: the times the simulator stamps on it (first token, done) and
its progress (tokens generated), read by metrics and by migrations (mode switch, P/D).
"""


class SimRequest:
    """Mutable per-request state; `__slots__` keeps 20k of them cheap."""

    __slots__ = (
        "arrival_s",
        "decode_instance",
        "decode_joined_s",
        "dispatched_s",
        "done_s",
        "endpoint",
        "first_token_s",
        "generated",
        "handoff_s",
        "id",
        "input_tokens",
        "kv_arrived_s",
        "kv_ready",
        "live_batch",
        "model",
        "output_tokens",
        "parked_s",
        "parked_without_decode",
        "recompute",
        "skip_layers",
    )

    def __init__(self, rid: int, model: int, arrival_s: float, inp: int, out: int) -> None:
        self.id = rid
        self.model = model
        self.arrival_s = arrival_s
        self.input_tokens = inp
        self.output_tokens = out
        self.first_token_s = -1.0
        self.done_s = -1.0
        self.dispatched_s = -1.0
        """When the router first gave it to an endpoint (-1: never)."""
        self.endpoint = -1
        """The endpoint (instance id) it first went to (-1: none)."""
        self.generated = 0
        self.kv_ready = False
        """Its KV cache came with it (a P/D hand-off): it joins the decode batch of the
        instance it is submitted to without a prefill there."""
        self.recompute = False
        """True when it must rebuild its KV cache (prompt + generated) before decoding."""
        # P/D hand-off (BlitzScale §6.1), the latest one (-1: none): `SimResult.handoffs`
        self.parked_s = -1.0
        """When its prefill instance parked it for a decode instance."""
        self.parked_without_decode = False
        """No decode instance served when it parked (it waits for one loading, or decodes
        in place)."""
        self.handoff_s = -1.0
        """When the P/D policy named its decode instance (its K/V began to move)."""
        self.kv_arrived_s = -1.0
        """When its K/V landed on the decode instance (queued there for a step)."""
        self.decode_joined_s = -1.0
        """When it joined the decode instance's decode batch (its first decode step there)."""
        self.decode_instance = -1
        """The instance (id) that decodes it, any system (-1: none)."""
        self.skip_layers = 0
        """First layers of its next prefill already run on another instance (BlitzScale
        live scaling, §4): the prefill here runs only the rest."""
        self.live_batch = -1
        """With `skip_layers`: the live batch it belongs to (its `SimResult.live_batches`
        index; -1: none). A live batch's last layers are a step of their own on its partner
        (`policy.blitzscale.live_step.next_step`)."""

    @property
    def prefill_tokens(self) -> int:
        """Tokens its next prefill processes."""
        return self.input_tokens + (self.generated if self.recompute else 0)

    @property
    def context_tokens(self) -> int:
        """KV-cache tokens it will hold at the end."""
        return self.input_tokens + self.output_tokens
