"""Settings objects: one place for defaults, every field documented, validated once.

This file holds the engine's settings (`EngineConfig`); every other layer keeps its settings
dataclass beside the code it configures (`control/settings.py`, `sim/settings.py`,
`runtime/launch/local.py`, each policy's `*Settings`), each documented and validated once; a
CLI flag or a config file fills one in and `validate()` checks it before anything starts.
"""

import os
from dataclasses import dataclass, field

from surge.errors import SurgeError

COMPILE_DECODE_ENV = "SURGE_COMPILE_DECODE"
"""Environment variable that sets the default of `EngineConfig.compile_decode` (and of every
setting that hands it on: `ControllerConfig`, the launchers, `surge node run`): unset, 1,
true, on: compiled; 0, false, off: eager. The test suite sets 0 (each engine would compile
~12 s of CPU beside it, tests/conftest.py); an explicit setting always wins."""

_ON, _OFF = ("", "1", "true", "on", "yes"), ("0", "false", "off", "no")


def compile_decode_default() -> bool:
    """The default of every `compile_decode` setting: on unless $SURGE_COMPILE_DECODE says
    off."""
    value = os.environ.get(COMPILE_DECODE_ENV, "").strip().lower()
    if value not in _ON + _OFF:
        raise SurgeError(
            f"${COMPILE_DECODE_ENV}={value[:20]!r} is not 1/true/on or 0/false/off; "
            "set one of those or unset it"
        )
    return value in _ON


@dataclass(frozen=True)
class EngineConfig:
    """Settings of one inference engine (one runner, its KV cache and its scheduler)."""

    page_size_tokens: int = 16
    """Tokens per KV-cache page; memory is handed out and reused in pages."""
    max_kv_tokens: int = 16384
    """KV-cache capacity in tokens (rounded up to whole pages), per layer range."""
    max_num_seqs: int = 64
    """Most sequences in the running batch at once."""
    max_prefill_tokens: int = 4096
    """Most prompt tokens prefilled in one step (with `prefill_chunk_tokens` 0, a longer prompt
    still runs whole, alone)."""
    prefill_chunk_tokens: int = 512
    """Chunked prefill: while other sequences decode, a prompt longer than this is prefilled
    in pieces of at most this many tokens, and after a piece the running sequences decode one
    token before the next piece, so a long prompt never stalls decodes for longer than one
    piece (0: never split). With nothing decoding a piece is `max_prefill_tokens`."""
    enable_prefix_caching: bool = True
    """Automatic prefix caching: full KV blocks are kept by hash after their sequence ends and
    reused by later sequences that start with the same tokens (`surge.engine.page_pool`)."""
    device: str = "auto"
    """`auto` (CUDA when present, else CPU), `cpu` or `cuda[:N]`; `fake` is for tests: the
    CPU computes, behind a fake GPU whose block copies are recorded (`surge.engine.devmem`)."""
    dtype: str = "auto"
    """Weights, activations and KV cache: `auto` (bfloat16 on CUDA, the store's dtype on the
    CPU; `surge.engine.device.compute_dtype`), `float32`, `bfloat16` or `float16`. Weights
    stored in another dtype are cast once as their block is taken in (a copy on the device)."""
    cuda_graphs: bool = True
    """On CUDA, replay a whole model's decode steps of up to 32 sequences as CUDA graphs,
    captured per batch-size bucket on first use (`surge.engine.cuda_graphs`); ignored on
    the CPU (its decode path is `compile_decode`)."""
    pack_cpu_weights: bool = True
    """On CPU with float32 weights, build a oneDNN-blocked copy of each projection and use it
    for calls of 2 or more rows (batched decode, prefill), which MKL runs slowly from the
    plain layout; one-row calls read the block buffer (`surge.engine.linear`). Gradual: packing
    starts at the first step with 2 or more sequences and packs at most
    `max_pack_bytes_per_step` per step, so blocks landing in a scale-out and batch-1 serving
    never pay for it and no step stalls on it (packing everything as blocks landed delayed a
    scale-out: scale_burst K=1 p50 TTFT 2.9 s vs 2.35 s). Costs a second copy of the
    projections. Ignored on CUDA and for other dtypes."""
    pack_min_hidden_size: int = 512
    """Packing applies to models at least this wide: measured on this project's VM (one
    thread, transposed weights), packed projections run 1.16x / 1.36x faster at 8 / 32 rows
    for hidden 512, but 0.67-0.82x as fast for hidden 256."""
    max_pack_bytes_per_step: int = 8 << 20
    """Most projection bytes packed in one step (at least one projection is); ~0.7 ms of CPU
    per MB on this project's VM (transpose + reorder). Also the most bytes fused (copied) in
    one step by `fuse_projections` on an older store (at least one layer)."""
    fuse_projections: bool = True
    """Compute q, k, v with one matmul and gate, up with one (`surge.engine.linear.
    fuse_linears`): fewer, larger calls stream the weights faster — on this project's VM
    (one thread, 100mb preset) the layers' projections take 0.85x the time at one row
    (batch-1 decode), 0.93-0.98x at 8 rows, 0.98-0.99x at 32. Stores of version 3 hold
    q|k|v and gate|up fused (`surge.model.stored_names`): no copy, off splits them into views.
    Older stores cost a copy of those weights (~2/3 of a Llama layer's bytes), made
    gradually: blocks land unfused and usable at once, and every step fuses at most
    `max_pack_bytes_per_step` of layers (`BlockWeights.fuse_some`). The block buffers stay
    untouched. The same tokens as unfused (tests/engine/test_fused_projections.py)."""
    compile_decode: bool = field(default_factory=compile_decode_default)
    """Run pure-decode steps as one `torch.compile`d (inductor) graph, which fuses the
    element-wise ops between projections (`surge.engine.compiled`): token ids to logits on
    a runner holding the whole model, its layers on a pipeline stage. Prefill stays eager.
    Never on the request path: a background thread compiles the graphs (batch 1 and batch
    >= 2, from a scratch page of the KV cache) as soon as the runner holds its layers —
    before the first request on a warm node — and steps run eager until a graph fits them.
    Graphs persist in inductor's on-disk cache (~/.cache/surge/inductor), so a later process
    on the same machine compiles far faster. A process that exits mid-compile abandons it
    (`surge.engine.compile_exit`: exit does not wait for it). On by default
    (`$SURGE_COMPILE_DECODE` changes the default). Needs a C++ compiler (g++, or `CXX`) and
    torch >= 2.6 (`torch.compiler.set_stance`); else decode stays eager. The CPU's decode
    path only: on CUDA decode steps are `cuda_graphs` (`surge.engine.device.decode_path`).
    In a node agent each graph's compile waits until the node is quiet (`compile_quiet_s`),
    or has served past `compile_defer_max_s` with no transfer."""
    compile_quiet_s: float = 2.0
    """A node agent lets its engines compile decode graphs (`compile_decode`) only once it has
    had nothing in flight for this long: no block moving in or out, no request in its
    instances or stages (`surge.policy.compile_gate`). Why: the compile runs dynamo and
    inductor in the agent's process, holding the GIL for seconds of Python per graph, and the
    agent's event loop (a scale-out's blocks, tokens) waited for it: measured with the
    compile beside a burst, a hot scale-out of a 32-MB model took 7.7 s instead of 2.0 s
    (docs/engine.md). A graph whose compile has begun finishes; the next waits again. A node
    never quiet this long compiles after `compile_defer_max_s` if it only serves. A
    standalone engine (`surge generate`, `LLMEngine`) compiles at once."""
    compile_defer_max_s: float = 40.0
    """How long requests (or stage steps) in flight may defer a node agent's decode-graph
    compile once no load, block transfer or multicast has run for `compile_quiet_s`; those
    always hold it (`surge.policy.compile_gate`). Why: a node that serves steadily is never
    quiet and would decode eager for good, and the compile's harm was measured on transfers;
    serving beside a compile loses what docs/engine.md measures. 40 s: the geometric mean of
    the measured break-evens (the compile's cost over the compiled step's gain: 22 s at
    batch 1, 69 s at batch 8, SmolLM2), so a loss at most ~2.8x the best choice made knowing
    the future (ski rental). inf: requests defer it for good."""

    @property
    def num_pages(self) -> int:
        return -(-self.max_kv_tokens // self.page_size_tokens)

    def validate(self) -> "EngineConfig":
        for name in (
            "page_size_tokens",
            "max_kv_tokens",
            "max_num_seqs",
            "max_prefill_tokens",
            "max_pack_bytes_per_step",
            "pack_min_hidden_size",
        ):
            if getattr(self, name) < 1:
                raise SurgeError(f"engine setting {name} must be >= 1")
        for name in ("compile_decode", "fuse_projections", "cuda_graphs"):
            if not isinstance(getattr(self, name), bool):
                raise SurgeError(f"engine setting {name} must be true or false")
        for name in ("compile_quiet_s", "compile_defer_max_s"):
            if not getattr(self, name) >= 0:  # also NaN
                raise SurgeError(f"engine setting {name} must be >= 0 seconds")
        if self.prefill_chunk_tokens < 0:
            raise SurgeError("engine setting prefill_chunk_tokens must be >= 0 (0: never split)")
        if self.device not in ("auto", "fake") and not self.device.startswith(("cpu", "cuda")):
            raise SurgeError(f"device {self.device!r} is not auto, cpu or cuda[:N]")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise SurgeError(
                f"engine dtype {self.dtype!r} is not auto, float32, bfloat16 or float16"
            )
        return self
