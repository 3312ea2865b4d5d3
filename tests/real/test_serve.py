"""`surge serve` on the real model answers /v1/completions and /v1/chat/completions, streaming
and not, exactly as transformers on the same GGUF at temperature 0: the same text (special
tokens skipped, stopped at EOS) and the same prompt_tokens (the chat template as the model
ships it, its BOS written by the template, not added again)."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.control.conftest import Serve, start_serve
from tests.real.reference import hf_greedy_ids

# A real 135M model on 2 shared cores. One xdist worker runs every test of tests/real, so
# the session fixtures (the GGUF import, transformers loading the GGUF) run once, not once
# per worker.
pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("real")]
MAX_TOKENS = 24
PROMPTS = ["The capital of France is", "def add(a, b):", "Three facts about the Moon: 1."]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name a primary color."},
    ],
    [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help you today?"},
        {"role": "user", "content": "What is 2 + 2?"},
    ],
]


@pytest.fixture(scope="module")
def server(smollm2_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    config = {"nodes": 1, "deployments": [{"name": "smollm2", "model": str(smollm2_store)}]}
    tmp = tmp_path_factory.mktemp("serve-smollm2")
    s = start_serve(tmp, tmp / "home", config)
    yield s
    s.stop()


def _reference(hf_smollm2, ids: list[int]) -> str:
    """transformers' greedy answer, special tokens skipped."""
    return hf_smollm2[1].decode(
        hf_greedy_ids(hf_smollm2, ids, MAX_TOKENS), skip_special_tokens=True
    )


def _post(server: Serve, path: str, body: dict) -> dict:
    r = server.http.post(path, json={"model": "smollm2", "max_tokens": MAX_TOKENS, **body})
    assert r.status_code == 200, r.text
    return r.json()


def _stream(server: Serve, path: str, body: dict) -> tuple[str, dict]:
    """(the streamed text joined, the usage chunk)."""
    req = {"model": "smollm2", "max_tokens": MAX_TOKENS, "stream": True, **body}
    req["stream_options"] = {"include_usage": True}
    text, usage = [], {}
    with server.http.stream("POST", path, json=req) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for c in chunk["choices"]:
                text.append(c.get("text") or (c.get("delta") or {}).get("content") or "")
    return "".join(text), usage


def test_completions_as_transformers(server: Serve, hf_smollm2) -> None:
    _, tok = hf_smollm2
    for prompt in PROMPTS:
        ids = tok(prompt).input_ids
        want = _reference(hf_smollm2, ids)
        got = _post(server, "/v1/completions", {"prompt": prompt, "temperature": 0})
        assert got["choices"][0]["text"] == want, prompt
        assert got["usage"]["prompt_tokens"] == len(ids)
        text, usage = _stream(server, "/v1/completions", {"prompt": prompt, "temperature": 0})
        assert (text, usage["prompt_tokens"]) == (want, len(ids)), prompt


def test_chat_as_transformers(server: Serve, hf_smollm2) -> None:
    _, tok = hf_smollm2
    for messages in CHATS:
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        want = _reference(hf_smollm2, list(ids))
        body = {"messages": messages, "temperature": 0}
        got = _post(server, "/v1/chat/completions", body)
        assert got["choices"][0]["message"]["content"] == want, messages
        assert got["usage"]["prompt_tokens"] == len(ids)
        assert got["choices"][0]["finish_reason"] in ("stop", "length")
        text, usage = _stream(server, "/v1/chat/completions", body)
        assert (text, usage["prompt_tokens"]) == (want, len(ids)), messages
    # The first chat's answer, as the reporter saw transformers give it.
    first = _post(server, "/v1/chat/completions", {"messages": CHATS[0], "temperature": 0})
    assert "Paris" in first["choices"][0]["message"]["content"]
