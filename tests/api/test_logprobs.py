"""The engine reports log-probabilities only for requests that ask, consistent with the
token it picked, and asking does not change the tokens (greedy stays token-exact)."""

import math
from pathlib import Path

from surge.engine.llm_engine import LLMEngine
from surge.engine.sampling import SamplingParams
from surge.runtime.protocol import Event, TokenGenerated


def _run(engine: LLMEngine, prompts, params):
    sids = [engine.add_request(p, q) for p, q in zip(prompts, params, strict=True)]
    events: dict[int, list] = {s: [] for s in sids}
    while engine.has_unfinished:
        for ev in engine.step():
            events[ev.seq_id].append(ev)
    return [events[s] for s in sids]


def test_logprobs_only_when_asked_and_tokens_unchanged(tiny_store: Path) -> None:
    engine = LLMEngine.from_store(tiny_store)
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    plain = SamplingParams(max_tokens=8, ignore_eos=True)
    asked = SamplingParams(max_tokens=8, ignore_eos=True, logprobs=3)
    with_lp, without = _run(engine, prompts, [asked, plain])
    ref = _run(LLMEngine.from_store(tiny_store), prompts, [plain, plain])
    assert [e.token_id for e in with_lp] == [e.token_id for e in ref[0]]
    assert all(e.logprobs is None for e in without)
    for e in with_lp:
        lp = e.logprobs
        assert lp is not None and len(lp.top) == 3
        assert lp.top[0][0] == e.token_id, "greedy picks the most likely token"
        assert math.isclose(lp.logprob, lp.top[0][1], rel_tol=1e-6)
        assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)
        assert all(v <= 0 for _, v in lp.top)
        assert sum(math.exp(v) for _, v in lp.top) <= 1 + 1e-5
    zero = _run(engine, prompts[:1], [SamplingParams(max_tokens=2, logprobs=0)])[0]
    assert all(e.logprobs is not None and e.logprobs.top == () for e in zero)


def test_token_event_carries_logprobs_over_the_wire() -> None:
    ev = TokenGenerated(
        node=0, t=1.0, instance="i", req_id="r", token=3, finished=False, finish_reason=None,
        logprob=-0.5, top_logprobs=((3, -0.5), (4, -1.25)),
    )  # fmt: skip
    back = Event.decode(ev.to_json())
    assert back == ev
    plain = TokenGenerated(
        node=0, t=1.0, instance="i", req_id="r", token=3, finished=True, finish_reason="stop"
    )
    assert Event.decode(plain.to_json()).logprob is None
    assert SamplingParams.from_json(SamplingParams(logprobs=2).to_json()).logprobs == 2
