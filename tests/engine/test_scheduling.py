"""Continuous batching, preemption, stopping and sampling of the local engine."""

import dataclasses
from pathlib import Path

import pytest
import torch

from surge.config import EngineConfig
from surge.engine.batch import BatchMeta
from surge.engine.llm_engine import LLMEngine
from surge.engine.sampling import Draw, SamplingParams, sample
from surge.errors import SurgeError
from surge.model.manifest import read_manifest

PROMPTS = [[0, 5, 9, 200, 31, 17, 4], [0, 8], [0, 3, 44, 55, 66, 77, 88, 99, 100, 101], [0, 7, 7]]
GREEDY = SamplingParams(max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def alone(tiny_store: Path) -> list[list[int]]:
    """Each prompt's greedy tokens when it runs by itself."""
    engine = LLMEngine.from_store(tiny_store)
    return [engine.generate([p], GREEDY)[0].token_ids for p in PROMPTS]


def test_sequences_join_and_leave_mid_run(tiny_store: Path, alone: list[list[int]]) -> None:
    engine = LLMEngine.from_store(tiny_store)
    ids = [engine.add_request(PROMPTS[0], GREEDY), engine.add_request(PROMPTS[1], GREEDY)]
    batch_sizes = []
    for step in range(60):
        if step == 5:  # a new request joins while the others decode
            ids.append(engine.add_request(PROMPTS[2], GREEDY))
        if step == 9:
            ids.append(
                engine.add_request(PROMPTS[3], SamplingParams(max_tokens=3, ignore_eos=True))
            )
        events = engine.step()
        batch_sizes.append(len(events))
        if not engine.has_unfinished:
            break
    assert not engine.has_unfinished
    seqs = [engine.seqs[i] for i in ids]
    assert [s.output_token_ids for s in seqs[:3]] == alone[:3]
    assert seqs[3].output_token_ids == alone[3][:3] and seqs[3].finish_reason == "length"
    assert max(batch_sizes) >= 3 and batch_sizes[-1] < max(batch_sizes)


def test_preemption_under_a_small_kv_cache_keeps_tokens(
    tiny_store: Path, alone: list[list[int]]
) -> None:
    # 40 tokens of cache cannot hold four sequences of up to 30 tokens: some get preempted
    # and recomputed by prefill over prompt + output, with the same tokens.
    engine = LLMEngine.from_store(tiny_store, EngineConfig(page_size_tokens=4, max_kv_tokens=40))
    outs = engine.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == alone
    runner = engine.executor.runner
    assert runner.kv.num_free_pages == runner.kv.num_pages  # every page came back


def test_max_num_seqs_limits_the_batch(tiny_store: Path, alone: list[list[int]]) -> None:
    engine = LLMEngine.from_store(tiny_store, EngineConfig(max_num_seqs=2))
    for p in PROMPTS:
        engine.add_request(p, GREEDY)
    sizes = []
    while engine.has_unfinished:
        sizes.append(len(engine.step()))
    assert max(sizes) == 2
    assert [engine.seqs[i].output_token_ids for i in range(4)] == alone


def test_stops_at_eos_and_stop_tokens(tiny_store: Path, alone: list[list[int]]) -> None:
    engine = LLMEngine.from_store(tiny_store)
    stop = alone[0][4]
    first = alone[0].index(stop)
    (out,) = engine.generate([PROMPTS[0]], SamplingParams(max_tokens=20, stop_token_ids=(stop,)))
    assert out.token_ids == alone[0][: first + 1] and out.finish_reason == "stop"
    # Make that token the model's EOS: generation stops there unless ignore_eos.
    engine.arch = dataclasses.replace(engine.arch, eos_token_ids=(stop,))
    (out,) = engine.generate([PROMPTS[0]], SamplingParams(max_tokens=20))
    assert out.token_ids == alone[0][: first + 1] and out.finish_reason == "stop"
    (out,) = engine.generate([PROMPTS[0]], SamplingParams(max_tokens=20, ignore_eos=True))
    assert out.token_ids == alone[0] and out.finish_reason == "length"


def test_seeded_sampling_is_reproducible_and_independent_of_batch(tiny_store: Path) -> None:
    engine = LLMEngine.from_store(tiny_store)
    p = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, top_k=40, seed=5, ignore_eos=True)
    (solo,) = engine.generate([PROMPTS[0]], p)
    batched = engine.generate(PROMPTS, [p, GREEDY, GREEDY, p])
    assert batched[0].token_ids == solo.token_ids
    other = engine.generate([PROMPTS[0]], dataclasses.replace(p, seed=6))[0]
    assert other.token_ids != solo.token_ids


def picked(logits: torch.Tensor, draws: list[Draw], position: int = 5) -> tuple[int, ...]:
    """`sample`'s tokens for a decode step of one row per draw, each at `position`."""
    n = len(draws)
    return sample(logits, draws, BatchMeta(tuple(range(n)), (position - 1,) * n, (1,) * n)).tokens


def test_sampler_filters() -> None:
    logits = torch.tensor([[0.0, 5.0, 4.9, -3.0]])
    # top_k=1 and a tiny top_p both reduce to the argmax.
    for d in (Draw(temperature=1.0, top_k=1, seed=0), Draw(temperature=1.0, top_p=1e-6, seed=0)):
        assert {picked(logits, [d], pos)[0] for pos in range(1, 21)} == {1}
    # top_k=2 only ever picks the two best.
    d = Draw(temperature=5.0, top_k=2, seed=0)
    assert {picked(logits, [d], pos)[0] for pos in range(1, 201)} == {1, 2}


def test_a_sampled_token_depends_on_its_seed_and_position_only() -> None:
    """Each sampled token's generator is seeded by (seed, position): the same row picks
    the same token in any batch, at any row, after any history (nothing is carried from
    step to step: a pipeline's last stage can change under a sequence), and another
    position or seed draws again."""
    logits = torch.zeros(1, 50)  # uniform: every draw is the generator's
    d = Draw(temperature=1.0, seed=42)
    alone = [picked(logits, [d], pos)[0] for pos in range(5, 25)]
    others = [Draw(), Draw(temperature=1.0, seed=7), None]
    batch = torch.cat([torch.randn(2, 50), logits, torch.randn(1, 50)])
    for pos in range(5, 25):
        rows = BatchMeta((0, 1, 2, 3), (9, 3, pos - 1, 0), (1, 1, 1, 4))
        assert sample(batch, [others[0], others[1], d, None], rows).tokens[2] == alone[pos - 5]
    assert len(set(alone)) > 5, "positions draw afresh"
    assert [picked(logits, [Draw(temperature=1.0, seed=43)], p)[0] for p in range(5, 25)] != alone


@pytest.mark.parametrize("temperature", [1e-30, 1e-40, 1e-300, 5e-324])
def test_a_temperature_near_zero_is_greedy_not_a_crash(temperature: float) -> None:
    """logits / T overflows float32 (1e-40) or even float64 (5e-324); the limit T -> 0 is
    the argmax (a fuzzed request with such a temperature killed the instance's loop)."""
    logits = torch.tensor([[0.0, 5.0, 4.9, -3.0], [2.0, -1.0, 0.5, 1.9]])
    for extra in ({}, {"top_k": 2}, {"top_p": 0.5}):
        d = SamplingParams(temperature=temperature, **extra).draw()
        assert picked(logits, [d, d]) == (1, 0)


def test_bad_requests_are_clear_errors(tiny_store: Path) -> None:
    engine = LLMEngine.from_store(tiny_store)
    limit = read_manifest(tiny_store).arch.max_position_embeddings
    with pytest.raises(SurgeError, match=r"prompt has \d+ tokens .* shorten the prompt"):
        engine.add_request([0] * limit, GREEDY)
    with pytest.raises(SurgeError, match="outside the vocabulary"):
        engine.add_request([0, 10**6], GREEDY)
    with pytest.raises(SurgeError, match="empty"):
        engine.add_request([], GREEDY)
    for bad in (
        SamplingParams(max_tokens=0),
        SamplingParams(temperature=-1),
        SamplingParams(top_p=0),
        SamplingParams(top_k=-2),
    ):
        with pytest.raises(SurgeError):
            engine.add_request([0, 1], bad)


def test_generation_stops_at_the_context_end(tmp_path: Path) -> None:
    from surge.model.importer import import_checkpoint
    from surge.model.tiny import create_tiny_model
    from surge.model.tiny_shape import TinyModelConfig

    create_tiny_model(tmp_path / "hf", TinyModelConfig(num_layers=2, max_position_embeddings=12))
    import_checkpoint(tmp_path / "hf", tmp_path / "s", progress=False)
    engine = LLMEngine.from_store(tmp_path / "s")
    (out,) = engine.generate([[0, 1, 2, 3, 4]], SamplingParams(max_tokens=50, ignore_eos=True))
    assert len(out.token_ids) == 12 - 5 and out.finish_reason == "length"


def test_a_token_span_reads_prompt_and_output_as_one_sequence() -> None:
    """`Sequence.token_span` (what each step feeds) is a slice of prompt + output, whichever
    side of the boundary it falls on."""
    from surge.engine.scheduler import Sequence

    seq = Sequence(0, [1, 2, 3, 4], GREEDY, output_token_ids=[5, 6, 7])
    whole = seq.all_token_ids
    for start in range(len(whole) + 1):
        for end in range(start, len(whole) + 1):
            assert seq.token_span(start, end) == whole[start:end], (start, end)
