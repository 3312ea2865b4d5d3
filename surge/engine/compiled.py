"""`DecodeGraph`: the layer stack of a decode step, compiled with `torch.compile` (inductor).

On by default (`EngineConfig.compile_decode`). Why: at batch 1 a decode step of a small model is
~35 eager ops per layer besides its 7 projections (norms, rope, KV write and page gather,
attention, residual adds), each paying PyTorch's per-op dispatch; inductor fuses the
element-wise chains into a few C++ loops and runs the whole stack from one call. The
projections stay opaque calls (up to `gemv.max_rows()` rows: surge's `surge::gemv_row`,
`engine/gemv.py`, which setup builds, else MKL; more rows: oneDNN's packed kernel through
`surge::packed_linear`), SDPA stays ATen's. Logits differ from eager in the last bits only
(inductor sums the norms in its own order), so only a near-tie could flip a greedy token;
measured, the tokens are the eager path's (tests/engine/test_compiled_decode.py).

What flows: a runner holding the whole model (`ModelRunner.forward`, a local instance) hands
a pure-decode step (every sequence 1 new token) to `DecodeGraph.model`: token ids to float32
logits in one graph (embedding, layers, final norm, lm_head), because the eager ops around
the graph cost more than their arithmetic here (each step streams ~92 MB of weights through
the caches, so the Python and dispatch work after it runs cache-cold). A pipeline stage's
`ModelRunner.run_layers` hands its layers to `DecodeGraph.__call__` (hidden states in and
out). Both get the step's `AttnContext`, the weights and the KV-cache views; prefill and mixed
steps stay eager (matmul-bound; their query lengths would only add graphs). Shapes that change
step to step are marked dynamic (batch, pages gathered, keys attended), so the graphs are few
and fixed: one for batch 1, one for batches 2-`gemv.max_rows()` (surge's kernel), one for
larger batches (compiled when the first such step comes) (and one more for each when packing,
`EngineConfig.pack_cpu_weights`, has swapped in packed projections; inductor's cache makes that
one quick). Keys are attended a whole page at a time under a mask (`AttnContext.num_keys`
None), so no per-step int enters the graph; a step gathers at least two pages (the second
masked), so a page count of 1 (which dynamo specializes) never asks for another graph.

Never on the request path: graphs are compiled by a background thread, from scratch inputs
(a reserved page of the KV cache, `PagedKVCache.scratch_context`), never from a live step.
The runner starts it as soon as it holds its layers (`ModelRunner.add_block`): on a warm
node that is before the first request; on a node serving while blocks land, steps run eager
until the graph is ready. A step uses a graph once one is ready and no compile is running,
under dynamo's `fail_on_recompile` stance: a step whose shape no graph fits (a new batch
class, packed weights swapped in) raises instead of compiling, runs eager, and hands its
shape class to the thread. With a `gate` (a node agent's, `runtime/node/compile_quiet.py`)
each graph's compile starts only while the gate is set: dynamo and inductor run Python in
this process for seconds per graph and hold the GIL meanwhile, so an agent's event loop
(blocks of a scale-out, tokens) would wait for them (measured: a hot scale-out of a 32-MB
model 1.96 -> 7.69 s with the compile beside it, docs/engine.md). Compiled graphs persist on
disk across processes: inductor's FX graph cache under `~/.cache/surge/inductor`
(`$TORCHINDUCTOR_CACHE_DIR` if set), so a second process on the same machine and model only
traces (~a quarter of the CPU, no C++ compile) instead of compiling. A process
that exits mid-compile abandons it cleanly and at once (`compile_exit`).
"""

import contextlib
import logging
import os
import shutil
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

# What `torch.compile` imports at its first call (~2 s of Python, holding the GIL): here, so a
# node agent pays it at start-up (`import_engine`), not while a scale-out's blocks arrive.
import torch._inductor.compile_fx
from torch._dynamo.utils import counters

from surge.engine import gemv
from surge.engine.attention import AttnContext
from surge.engine.compile_exit import CompileAbandoned, stop_at_exit
from surge.engine.decode_graphs import (
    MODEL,
    STACK,
    CompileJob,
    batch_class,
    decode_model,
    decode_stack,
    mark_dynamic,
)
from surge.engine.model import HeadWeights, LayerWeights
from surge.errors import SurgeError
from surge.model.arch import ModelArch

log = logging.getLogger(__name__)


RECOMPILE_REFUSED = "Detected recompile when torch.compile stance is 'fail_on_recompile'"
"""The start of the error dynamo raises for a call no graph fits under `fail_on_recompile`."""
DYNAMO_LOCK = threading.Lock()
"""Held by a background compile while it compiles one graph. Dynamo is not thread-safe: two
threads compiling at once, or a step looking up the graphs of a code object (all runners
share `decode_model`'s) while another thread adds one, crashed the process (SIGFPE) in tests.
So one compile at a time per process, and steps run eager while any compile runs."""


def wait_for_compiles(timeout_s: float = -1) -> bool:
    """Wait until no background compile runs in this process (before touching dynamo's
    global state, e.g. `torch._dynamo.reset()`); False on timeout."""
    if not DYNAMO_LOCK.acquire(timeout=timeout_s):
        return False
    DYNAMO_LOCK.release()
    return True


GATE_POLL_S = 0.5
"""How often a compile waiting for its gate checks that its runner still exists."""
MAX_REFUSALS = 16
"""Steps no graph fits before decode stays eager for good (past dynamo's recompile limit a
compile produces no graph, and every step would start another)."""


def surge_inductor_cache_dir() -> Path:
    """Where compiled graphs persist across processes and reboots unless
    `$TORCHINDUCTOR_CACHE_DIR` names another directory: `$XDG_CACHE_HOME` (or ~/.cache)
    /surge/inductor (torch's default is under /tmp)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "surge" / "inductor"


class DecodeGraph:
    """One runner's compiled decode step: graphs compiled in a background thread, used by
    steps only once they fit (see the module docstring)."""

    def __init__(
        self,
        compile_args: Callable[[CompileJob], tuple],
        settle_weights: Callable[[], None] = lambda: None,
        backend: str | Callable = "inductor",
        gate: threading.Event | None = None,
    ) -> None:
        """`compile_args(job)`: scratch inputs of that job's graph (called in the thread);
        `settle_weights()`: finish fusing and packing before compiling, so the graphs are
        compiled for the weights the steps will have; `backend`: inductor, or any
        `torch.compile` backend (tests); `gate`: each graph's compile waits until it is set
        (a node agent sets it only while the node is quiet), None: compile at once."""
        compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")
        if backend == "inductor" and not compiler:
            raise SurgeError(
                "compile_decode needs a C++ compiler for inductor (install g++, or set CXX); "
                "or turn compile_decode off"
            )
        # Inductor reads the variable on each cache access, and writes its /tmp default
        # into it when first asked: replace that default (not a directory a user chose).
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        if os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, default_cache_dir()):
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(surge_inductor_cache_dir())
        # No size/stride/alignment asserts in inductor's wrapper (~60 calls per step at 6
        # layers): dynamo's guards already check every input's sizes and strides. The
        # wrapper itself in C++ (`cpp_wrapper`): the Python one costs ~0.3-0.5 ms per step
        # (its kernel calls and views); measured on this project's VM, 100mb preset, one
        # thread, same tokens: batch-1 decode 6.0-6.6 -> 5.5-6.1 ms of CPU per step.
        options = {"size_asserts": False, "alignment_asserts": False, "cpp_wrapper": True}
        kw: dict = {"options": options} if backend == "inductor" else {"backend": backend}
        self.fns = {
            STACK: torch.compile(decode_stack, dynamic=None, **kw),
            MODEL: torch.compile(decode_model, dynamic=None, **kw),
        }
        # Dynamo's recompile limit counts per code object, shared by every runner in the
        # process (2 graphs each): room for many runners before steps would stay eager.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        # Weakly: a runner dropped while its graphs compile (a short-lived engine) is freed,
        # and the thread stops at its next graph instead of compiling for nobody.
        self._compile_args = _weak(compile_args)
        self._settle_weights = _weak(settle_weights)
        self.num_calls = 0
        """Steps that ran a compiled graph."""
        self.num_model_calls = 0
        """Of `num_calls`, those through `model` (token ids to logits in one graph)."""
        self.num_eager_steps = 0
        """Decode steps that ran eager because no graph was ready for them."""
        self.num_refusals = 0
        """Steps no graph fitted (each hands its batch class to the compile thread)."""
        self.num_compiles = 0
        """Graphs compiled for this runner (each logged with its time)."""
        self.compile_s = 0.0
        self.gate = gate
        self.num_gate_waits = 0
        """Graphs whose compile waited for the gate (the node was busy when it was due)."""
        self._pending: list[CompileJob] = []
        """Jobs the thread will compile, in order (the first may be compiling now)."""
        self._ready: set[str] = set()
        """STACK and/or MODEL once a graph of it is compiled: before, a step would compile."""
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.error: BaseException | None = None
        """A compile that failed (logged; steps then stay eager)."""

    @property
    def compiling(self) -> bool:
        """A compile runs, or waits for the gate to run."""
        return self._thread is not None and self._thread.is_alive()

    def start(self, jobs: Sequence[CompileJob]) -> bool:
        """Compile these graphs in the background thread (started if none runs; jobs queued
        already are not queued twice); False if a compile failed before (steps then stay
        eager)."""
        with self._lock:
            if self.error is not None:
                return False
            self._pending += [job for job in jobs if job not in self._pending]
            if not self.compiling:
                self._thread = threading.Thread(
                    target=self._compile_all, name="surge-compile", daemon=True
                )
                stop_at_exit(self._thread)
                self._thread.start()
            return True

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for the background compile (if any); True once none is running."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        return not self.compiling

    def _compile_all(self) -> None:
        with contextlib.suppress(CompileAbandoned):  # raised just after the jobs ended
            self._compile_jobs()

    def _compile_jobs(self) -> None:
        """The thread: each queued job in turn, each after the gate opened, until none is
        left (checked under the lock `start` queues under, so none is left behind)."""
        settled = False
        try:
            while True:
                with self._lock:
                    if not self._pending:
                        self._thread = None
                        return
                    job = self._pending[0]
                if not self._wait_for_gate():
                    return
                with DYNAMO_LOCK, torch.inference_mode():  # the steps' mode: graphs guard on it
                    if not settled:
                        settle = self._settle_weights()
                        if settle is None:
                            return
                        settle()
                        del settle
                        settled = True
                    if not self._compile(job):
                        return
                with self._lock:
                    self._pending.remove(job)
        except CompileAbandoned:  # the process exits (`surge.engine.compile_exit`)
            self.error = RuntimeError("compile abandoned at exit")
        except Exception as e:  # a failed compile must not take the server down: eager stays
            self.error = e
            log.warning("compiling the decode step failed (%s); decode stays eager", e)
        finally:
            with self._lock:
                if self._thread is threading.current_thread():  # ended early: none will run
                    self._pending.clear()

    def _wait_for_gate(self) -> bool:
        """Wait until the gate is set (at once without one); False when the runner is gone
        meanwhile. Outside `DYNAMO_LOCK`: other runners' ready graphs keep running."""
        gate = self.gate
        if gate is None or gate.is_set():
            return True
        self.num_gate_waits += 1
        log.info("the decode-graph compile waits until the node is quiet")
        while not gate.wait(GATE_POLL_S):
            if self._compile_args() is None:
                return False
        return True

    def _compile(self, job: CompileJob) -> bool:
        """Compile one graph; False when its runner is gone."""
        which, _ = job
        compile_args = self._compile_args()
        if compile_args is None:
            return False
        args = compile_args(job)
        del compile_args
        mark_dynamic(which, args)
        before = counters["stats"]["unique_graphs"]
        start = time.perf_counter()
        self.fns[which](*args)
        self._ready.add(which)
        if counters["stats"]["unique_graphs"] == before:
            return True  # a graph for it existed already
        took = time.perf_counter() - start
        self.num_compiles += 1
        self.compile_s += took
        ctx = args[-3]
        assert isinstance(ctx, AttnContext)
        log.info(
            "compiled the decode step (%s, batch %s, %d layers) in %.1f s in the background "
            "(compile %d, %.1f s in all)",
            which,
            {1: "1", 2: f"2-{gemv.max_rows()}"}.get(job[1], f"> {gemv.max_rows()}"),
            len(args[-2]),
            took,
            self.num_compiles,
            self.compile_s,
        )
        return True

    def __call__(
        self,
        x: torch.Tensor,
        layers: tuple[LayerWeights, ...],
        arch: ModelArch,
        ctx: AttnContext,
        k_caches: tuple[torch.Tensor, ...],
        v_caches: tuple[torch.Tensor, ...],
    ) -> torch.Tensor | None:
        """Hidden states [B, 1, hidden] through `layers` (a pipeline stage's range); None:
        no graph is ready for this step, run it eager."""
        return self._try(STACK, (x, layers, arch, ctx, k_caches, v_caches))

    def model(
        self,
        token_ids: torch.Tensor,
        embedding: torch.Tensor,
        layers: tuple[LayerWeights, ...],
        head: HeadWeights,
        arch: ModelArch,
        ctx: AttnContext,
        k_caches: tuple[torch.Tensor, ...],
        v_caches: tuple[torch.Tensor, ...],
    ) -> torch.Tensor | None:
        """Token ids [B, 1] -> float32 logits [B, vocab] through the whole model, one call;
        None: no graph is ready for this step, run it eager."""
        args = (token_ids, embedding, layers, head, arch, ctx, k_caches, v_caches)
        out = self._try(MODEL, args)
        self.num_model_calls += out is not None
        return out

    def use(self, which: str, batch_size: int) -> bool:
        """Whether a step of `batch_size` tries a graph of `which` now (else it runs eager,
        as with `compile_decode` off, and is counted so)."""
        if self.may_fit(which, batch_size):
            return True
        self.num_eager_steps += 1
        return False

    def may_fit(self, which: str, batch_size: int) -> bool:
        """A graph of `which` is compiled, none is compiling, and this batch class's is not
        on its way (or waiting for the gate)."""
        return (
            self.error is None
            and which in self._ready  # no graph yet: the call would compile one
            and (which, batch_class(batch_size)) not in self._pending
            and not DYNAMO_LOCK.locked()
        )

    def _try(self, which: str, args: tuple) -> torch.Tensor | None:
        """Run a ready graph; never compile here (the request path)."""
        job = (which, batch_class(args[0].shape[0]))
        if not self.use(which, args[0].shape[0]):
            return None
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                out = self.fns[which](*args)
        except RuntimeError as e:
            if not str(e).startswith(RECOMPILE_REFUSED):
                raise
            self.num_eager_steps += 1
            self.num_refusals += 1
            if self.num_refusals > MAX_REFUSALS:  # compiles that never fit: stop trying
                self.error = RuntimeError(f"no compiled graph fit after {MAX_REFUSALS} tries")
                log.warning("decode stays eager: %s", self.error)
                return None
            self.start([job])
            return None
        self.num_calls += 1
        return out


def _weak(fn: Callable) -> Callable[[], Callable | None]:
    """A weak reference to a callable (a bound method: to its object)."""
    if hasattr(fn, "__self__"):
        return weakref.WeakMethod(fn)  # type: ignore[arg-type]
    return lambda: fn
