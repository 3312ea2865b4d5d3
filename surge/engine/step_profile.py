"""Measure one real engine's steps: the profile BlitzScale's load monitor derives its bounds from.

BlitzScale §5.3: "The upper bound can be derived by profiling the average serving load
per-instance offline." What flows: a model store's manifest and the engine settings the
agents run it with in; out a `StepProfile` (`policy.blitzscale.monitor`): the wall-clock
seconds of one prefill step per prompt length and of one decode step per batch, taken on this
machine's device by a full local engine (`LLMEngine`, as an agent's instance runs it). Which
bounds follow from it is policy's (`policy.blitzscale.monitor.profile_costs`); caching it per
model, device and settings is `runtime/step_profiles.py`'s. No sockets; seconds of work
(SmolLM2-135M, one thread, its decode graphs in inductor's cache: about a minute on this
repository's busy 2-core VM), reported through `progress`.

The step measured is the engine's steady state, the one it serves with: on the CPU with
`compile_decode` the compiled decode graph (`engine/compiled.py`), not the eager step a fresh
engine runs while its graphs compile in the background. Each batch first runs a few steps
(which hand a missing graph's shape class to the compile thread), the profile then waits for
every compile to finish (the engine's compile thread and all its jobs: `DecodeGraph.wait`),
runs them again and waits again, and only then times; a compile that ran during the timing
(the engine's compile count moved, or one is running at the end) throws the timing away and
it is timed again. Prefills are timed the same way (the runner starts its first graphs'
compile as soon as it holds its layers: it must not run beside them). On CUDA the step is
the captured CUDA graph (`engine/cuda_graphs.py`), captured by the warm-up steps. Prompts
are random token ids (no prefix-cache hit). Timed in wall-clock seconds, the fastest of
several (another process on the machine only ever adds time; a profile taken on a busy
machine says so in a warning).
"""

import logging
import os
import platform
import random
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from surge.config import EngineConfig
from surge.engine.compiled import wait_for_compiles
from surge.engine.device import pick_device
from surge.engine.llm_engine import LLMEngine, LocalExecutor
from surge.engine.prompt_limits import context_limit
from surge.engine.runner import ModelRunner
from surge.engine.sampling import SamplingParams
from surge.model.manifest import Manifest
from surge.policy.blitzscale.monitor import StepProfile

log = logging.getLogger(__name__)

PREFILL_TOKENS = (32, 128, 512)
"""Prompt lengths timed (capped by the engine's prefill chunk and the context): a longer
prompt is prefilled in chunks of at most the chunk."""
DECODE_BATCHES = (1, 8, 16, 32, 64)
"""Decode batches timed (those up to `max_num_seqs`, and `max_num_seqs` itself)."""
DECODE_PROMPT_TOKENS = 8
"""Each decoding sequence's prompt (short: the step is the decode, not the context)."""
DECODE_STEPS = 8
"""Decode steps timed per batch (the fastest counts: `_steady`)."""
WARM_STEPS = 3
"""Steps each batch runs before its timing, twice (a graph compiles or is captured)."""
PREFILL_REPS = 3
"""Prefills timed per length (the fastest counts)."""
MAX_TRIES = 3
"""Timings of one batch before its last is kept even though a compile ran meanwhile."""
COMPILE_WAIT_S = 600.0
"""Longest wait for the background compiles (a cold inductor cache on a busy CPU: minutes)."""


def device_label(config: EngineConfig) -> str:
    """The device the engine runs on here, as a profile is keyed: the GPU's name, or the
    CPU's model and the threads torch uses (a step's time depends on both)."""
    device = pick_device(config.device)
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return f"cpu:{_cpu_model()}:{torch.get_num_threads()}threads"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def measure_steps(
    manifest: Manifest,
    config: EngineConfig,
    progress: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> StepProfile:
    """Time `manifest`'s engine under `config` here (module docstring); `clock` is
    wall-clock seconds unless a benchmark asks for another (its process's CPU time)."""
    say = progress or (lambda msg: log.info("%s", msg))
    start_s = time.perf_counter()
    say(f"profiling {manifest.name} on {device_label(config)}: loading the engine")
    executor = LocalExecutor.from_store(manifest, config)
    engine, runner = LLMEngine(manifest, config, executor), executor.runner
    rng = random.Random(0)
    vocab = manifest.arch.vocab_size

    def prompt(n: int) -> list[int]:
        return [rng.randrange(min(100, vocab - 1), vocab) for _ in range(n)]

    limit = context_limit(manifest.arch, config) - 2
    chunk = config.prefill_chunk_tokens or config.max_prefill_tokens
    lengths = sorted({min(n, chunk, config.max_prefill_tokens, limit) for n in PREFILL_TOKENS})
    say("  settling the weights (fusing, packing: the first steps' work)")
    runner.weights.settle()  # fuse and pack now, as they serve once settled
    prefill = []
    for n in lengths:
        timings = partial(_prefill_times, engine, n, prompt, clock)
        prefill.append((n, _steady(runner, timings)))
        say(f"  prefill {n:4d} tokens: {prefill[-1][1] * 1e3:8.1f} ms")
    batches = sorted({b for b in DECODE_BATCHES if b < config.max_num_seqs} | {config.max_num_seqs})
    decode = []
    for b in batches:
        for _ in range(2):  # a batch class no graph fits hands it to the compile thread
            _decode_times(engine, b, prompt, WARM_STEPS, clock)
            _wait_for_compiles(runner)
        timings = partial(_decode_times, engine, b, prompt, DECODE_STEPS, clock)
        decode.append((b, _steady(runner, timings)))
        say(f"  decode batch {b:3d}: {decode[-1][1] * 1e3:8.1f} ms/step")
    say(f"profiled {manifest.name} in {time.perf_counter() - start_s:.1f} s")
    load = os.getloadavg()[0]
    if load > (os.cpu_count() or 1):
        log.warning(
            "the machine was busy while %s was profiled (load average %.1f on %d CPUs): its "
            "steps may be slower than an instance's; profile again when it is quiet "
            "(`surge model profile --remeasure`)", manifest.name, load, os.cpu_count() or 1,
        )  # fmt: skip
    return StepProfile(tuple(prefill), tuple(decode))


def _timed_step(engine: LLMEngine, clock: Callable[[], float]) -> float:
    start = clock()
    engine.step()  # its tokens come back as ints: a CUDA step has synchronized
    return clock() - start


def _drain(engine: LLMEngine) -> None:
    """Finish what is in the engine and forget it."""
    while engine.has_unfinished:
        engine.step()
    engine.seqs.clear()


def _wait_for_compiles(runner: ModelRunner) -> None:
    """Wait until no background compile runs: this runner's compile thread, every job it
    holds (`DecodeGraph.wait`), and any other in the process (`wait_for_compiles`)."""
    graph = runner.decode_graph
    done = graph.wait(COMPILE_WAIT_S) if graph is not None else True
    if not (done and wait_for_compiles(COMPILE_WAIT_S)):
        log.warning("step profile: decode graphs still compiling after %.0f s", COMPILE_WAIT_S)


def _compiles(runner: ModelRunner) -> tuple[int, bool]:
    """This runner's compiles so far, and whether one runs now (no graph: none ever)."""
    graph = runner.decode_graph
    return (0, False) if graph is None else (graph.num_compiles, graph.compiling)


def _steady(runner: ModelRunner, timings: Callable[[], list[float]]) -> float:
    """The least of `timings` (another process on the machine only ever adds time) taken
    while no background compile ran (its CPU and the GIL would count): once none runs,
    timed; timed again if one ran meanwhile (a compile started, ended, or is running)."""
    times: list[float] = []
    for _ in range(MAX_TRIES):
        _wait_for_compiles(runner)
        before = _compiles(runner)
        times = timings()
        if _compiles(runner) == before and wait_for_compiles(0):
            break
        log.info("step profile: a decode graph compiled while timing: timing again")
    return min(times)


def _prefill_times(
    engine: LLMEngine, n: int, prompt: Callable[[int], list[int]], clock: Callable[[], float]
) -> list[float]:
    """Seconds of `PREFILL_REPS` prefills of one `n`-token prompt (after an untimed one:
    the shape's first-use work)."""
    times = []
    for rep in range(PREFILL_REPS + 1):
        engine.add_request(prompt(n), SamplingParams(max_tokens=1, ignore_eos=True))
        step_s = _timed_step(engine, clock)
        times += [step_s] if rep else []
        _drain(engine)
    return times


def _decode_times(
    engine: LLMEngine,
    batch: int,
    prompt: Callable[[int], list[int]],
    steps: int,
    clock: Callable[[], float],
) -> list[float]:
    """Prefill `batch` short prompts, then time `steps` decode steps of all of them."""
    params = SamplingParams(max_tokens=steps + 1, ignore_eos=True)
    for _ in range(batch):
        engine.add_request(prompt(DECODE_PROMPT_TOKENS), params)
    while any(not s.output_token_ids for s in engine.seqs.values()):  # the prefill step(s)
        engine.step()
    times = [_timed_step(engine, clock) for _ in range(steps) if engine.has_unfinished]
    _drain(engine)
    return times
