"""The compiled decode step (`EngineConfig.compile_decode`): the eager path's greedy tokens,
and a fixed handful of graphs however batch size and sequence lengths move.

One heavy test on purpose: it compiles inductor graphs (tiny model, 2-3 graphs): ~70 s on the
loaded 2-core VM with a cold inductor cache, ~15 s warm; the other engine tests stay eager.
"""

from pathlib import Path

import pytest

from surge.config import EngineConfig
from surge.engine.llm_engine import LLMEngine
from surge.engine.sampling import SamplingParams
from surge.errors import SurgeError
from surge.model.manifest import read_manifest

MAX_GRAPHS = 3
"""Batch 1, batch >= 2, and batch 1 again once packing swapped projections in."""


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
    out = {}
    for mode, engine in engines.items():
        batch = engine.generate(prompts, params)
        single = engine.generate(lone, lone_params)
        out[mode] = [c.token_ids for c in batch + single]
    assert out[True] == out[False]
    graph = engines[True].executor.runner.decode_graph
    assert engines[False].executor.runner.decode_graph is None
    assert graph is not None and graph.num_calls >= 40
    assert 1 <= graph.num_compiles <= MAX_GRAPHS
