"""The compiled decode step (`EngineConfig.compile_decode`): the eager path's greedy tokens,
and a fixed handful of graphs however batch size and sequence lengths move.

One heavy test on purpose: it compiles inductor graphs (tiny model, 2-3 graphs): ~70 s on the
loaded 2-core VM with a cold inductor cache, ~15 s warm; the other engine tests stay eager.
"""

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from surge.config import EngineConfig
from surge.engine.batch import BatchMeta
from surge.engine.llm_engine import LLMEngine
from surge.engine.runner import ModelRunner
from surge.engine.sampling import SamplingParams
from surge.errors import SurgeError
from surge.model.manifest import read_manifest

MAX_GRAPHS = 2
"""Batch 1 and batches 2-`gemv.max_rows()` (compiled in the background once the weights are
packed; packing changes neither, their projections being surge's kernel, and a step always
gathers 2+ pages); a larger batch adds a third when it first comes."""


def test_compile_decode_is_validated() -> None:
    with pytest.raises(SurgeError, match="compile_decode"):
        EngineConfig(compile_decode="yes").validate()  # type: ignore[arg-type]


def test_compiled_decode_matches_eager_with_few_graphs(tiny_store: Path) -> None:
    # Packing even this narrow model, so the compiled graph also runs oneDNN's packed op.
    base = {"pack_min_hidden_size": 1, "page_size_tokens": 8}
    engines = {
        mode: LLMEngine(read_manifest(tiny_store), EngineConfig(compile_decode=mode, **base))
        for mode in (False, True)
    }
    # A ragged batch that shrinks 3 -> 2 -> 1 as requests finish, crossing page boundaries,
    # then a lone request: batch sizes and key counts change at almost every step.
    prompts = [[5 + i % 50 for i in range(n)] for n in (5, 19, 33)]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (30, 12, 4)]
    lone = [[7 + i % 40 for i in range(41)]]
    lone_params = SamplingParams(max_tokens=20, ignore_eos=True)
    graph = engines[True].executor.runner.decode_graph
    assert graph is not None and graph.wait(timeout_s=600)  # the background compile
    assert graph.error is None and graph.num_compiles == MAX_GRAPHS
    out = {}
    for mode, engine in engines.items():
        batch = engine.generate(prompts, params)
        single = engine.generate(lone, lone_params)
        out[mode] = [c.token_ids for c in batch + single]
    assert out[True] == out[False]
    assert engines[False].executor.runner.decode_graph is None
    # Every decode step ran a graph compiled ahead: none waited, none fell back to eager.
    assert graph.num_calls >= 40 and graph.num_eager_steps == 0
    assert graph.num_compiles == MAX_GRAPHS
    # A full local runner decodes token ids to logits in one graph (embedding and head in it).
    assert graph.num_model_calls == graph.num_calls


def test_a_batch_above_the_kernels_rows_gets_its_own_graph(tiny_store: Path) -> None:
    """A graph of batches 2-`gemv.max_rows()` guards on at most that many rows (surge's
    kernel); a larger batch gets a third graph, compiled in the background when it first comes, and
    runs it from then on with the eager path's tokens (one graph for every batch >= 2 made
    larger batches refuse on every step until decode stayed eager for good)."""
    from surge.engine import gemv

    base = {"pack_min_hidden_size": 1, "page_size_tokens": 8}
    n = gemv.max_rows() + 2
    prompts = [[5 + (i * 7 + j) % 50 for j in range(3 + i)] for i in range(n)]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    eager = LLMEngine(read_manifest(tiny_store), EngineConfig(compile_decode=False, **base))
    want = [c.token_ids for c in eager.generate(prompts, params)]
    engine = LLMEngine(read_manifest(tiny_store), EngineConfig(compile_decode=True, **base))
    graph = engine.executor.runner.decode_graph
    assert graph is not None and graph.wait(timeout_s=600) and graph.error is None
    first = [c.token_ids for c in engine.generate(prompts, params)]  # starts the third graph
    assert graph.wait(timeout_s=600) and graph.error is None
    eager_steps, calls = graph.num_eager_steps, graph.num_calls
    again = [c.token_ids for c in engine.generate(prompts, params)]
    assert first == again == want
    assert graph.num_eager_steps == eager_steps  # every decode step ran a graph
    assert graph.num_calls == calls + params.max_tokens - 1


def test_compiled_stages_match_eager(tiny_store: Path) -> None:
    """Pipeline stages (a runner over part of the layers) run only their layers compiled;
    two stages in a row give the whole eager model's greedy tokens."""
    manifest = read_manifest(tiny_store)
    cut = manifest.arch.num_layers // 2
    config = EngineConfig(compile_decode=True, page_size_tokens=8)
    first = ModelRunner(manifest, config, (0, cut))
    last = ModelRunner(manifest, config, (cut, manifest.arch.num_layers))
    first.load_blocks()
    last.load_blocks()
    assert not first.holds_whole_model and not last.holds_whole_model
    prompt = [3 + i % 30 for i in range(13)]
    for runner in (first, last):
        assert runner.decode_graph is not None and runner.decode_graph.wait(timeout_s=600)
    eager = LLMEngine(manifest, EngineConfig(page_size_tokens=8, compile_decode=False))
    want = eager.generate([prompt], SamplingParams(max_tokens=12, ignore_eos=True))[0].token_ids
    got: list[int] = []
    tokens, ctx_len = prompt, 0
    while len(got) < len(want):
        batch = BatchMeta(seq_ids=(0,), q_lens=(len(tokens),), ctx_lens=(ctx_len,))
        hidden = first.run_layers(0, cut, first.embed(torch.tensor([tokens])), batch)
        hidden = last.run_layers(cut, manifest.arch.num_layers, hidden, batch)
        got.append(int(last.logits(hidden, batch).argmax(-1)))
        ctx_len += len(tokens)
        tokens = got[-1:]
    assert got == want
    for runner in (first, last):
        assert runner.decode_graph is not None
        assert runner.decode_graph.num_calls == len(want) - 1  # every decode step, compiled
        assert runner.decode_graph.num_model_calls == 0


def test_a_cold_node_serves_eager_while_its_graph_compiles(
    tiny_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compile never sits on the first-token path: with the background compile held
    back, a request's first token and whole answer come eager (event order recorded), and
    the steps after the graph is ready run it, with the same tokens."""
    from surge.engine import compiled

    events: list[str] = []
    release = threading.Event()
    real = compiled.DecodeGraph._compile

    def held_compile(self, job):  # the thread's compile, held until released
        events.append("compile started")
        assert release.wait(timeout=600)
        real(self, job)
        events.append("graph ready")

    monkeypatch.setattr(compiled.DecodeGraph, "_compile", held_compile)
    config = EngineConfig(page_size_tokens=8, compile_decode=True)
    engine = LLMEngine(read_manifest(tiny_store), config)
    graph = engine.executor.runner.decode_graph
    assert graph is not None and graph.compiling  # started when the blocks landed
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    prompt = [3 + i % 30 for i in range(11)]
    engine.add_request(prompt, params)
    while engine.has_unfinished:
        for _event in engine.step():
            events.append("first token" if "first token" not in events else "token")
    cold = [c.token_ids for c in engine.generate([prompt], params)]
    assert graph.num_calls == 0 and graph.num_eager_steps >= 2 * (params.max_tokens - 1)
    release.set()
    assert graph.wait(timeout_s=600) and graph.error is None
    assert events.index("first token") < events.index("graph ready")
    assert events.count("token") == params.max_tokens - 1
    assert events.index("token") < events.index("graph ready")  # decoding went on, eager
    warm = [c.token_ids for c in engine.generate([prompt], params)]
    assert warm == cold
    assert graph.num_calls == params.max_tokens - 1  # every decode step of the warm run


HELD_COMPILE = """
import sys, threading, time
from pathlib import Path
from surge.config import EngineConfig
from surge.engine import compiled
from surge.engine.runner import ModelRunner
from surge.model.manifest import read_manifest

runner = ModelRunner(read_manifest(Path(sys.argv[1])), EngineConfig(compile_decode=False))
runner.load_blocks()
inside = threading.Event()

def held_backend(gm, example_inputs):  # a compile inside dynamo's frame that never ends
    inside.set()
    try:
        while True:
            time.sleep(0.01)
    except BaseException as e:
        print("compile unwound:", type(e).__name__, flush=True)
        raise

graph = compiled.DecodeGraph(runner.compile_args, backend=held_backend)
graph.start([(compiled.MODEL, 1)])
assert inside.wait(300)
print("exiting mid-compile", flush=True)
"""


def test_a_process_exits_cleanly_mid_compile(tiny_store: Path) -> None:
    """A process that ends while its decode graph compiles (a short `surge generate`, a
    stage process) exits 0 and at once: the compile thread is unwound before the interpreter
    finalizes (a daemon thread still inside dynamo then crashed the process: SIGSEGV or
    SIGABRT at exit), and exit does not wait for the compile to finish."""
    proc = subprocess.run(
        [sys.executable, "-c", HELD_COMPILE, str(tiny_store)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines == ["exiting mid-compile", "compile unwound: CompileAbandoned"], proc.stdout
