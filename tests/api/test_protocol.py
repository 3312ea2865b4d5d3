"""The request models refuse what surge cannot honour, naming the field, and turn the rest
into engine settings in one place (`to_sampling_params`)."""

import json

import pytest

from surge.api.protocol import ChatRequest, CompletionRequest, parse
from surge.engine.sampling import SEED_MAX, SEED_MIN, Draw
from surge.errors import InvalidInput, SurgeError

M = {"model": "m"}


def comp(**kw) -> CompletionRequest:
    return parse(CompletionRequest, json.dumps({**M, "prompt": "hi", **kw}).encode())


def chat(messages, **kw) -> ChatRequest:
    return parse(ChatRequest, json.dumps({**M, "messages": messages, **kw}).encode())


def refused(fn, *words: str, param: str | None = None) -> InvalidInput:
    with pytest.raises(InvalidInput) as e:
        fn()
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    if param is not None:
        assert e.value.param == param, (e.value.param, str(e.value))
    return e.value


@pytest.mark.parametrize("seed", [2**64, 2**63, SEED_MIN - 1])
def test_seed_outside_int64_is_refused(seed) -> None:  # defect 1
    refused(lambda: comp(seed=seed), "seed", param="seed")
    assert comp(seed=SEED_MAX).seed == SEED_MAX and comp(seed=SEED_MIN).seed == SEED_MIN


def test_engine_refuses_an_out_of_range_seed_with_a_surge_error() -> None:  # defect 1
    with pytest.raises(SurgeError, match="seed"):
        Draw(temperature=1.0, seed=2**64)
    Draw(temperature=1.0, seed=SEED_MIN)  # the edges work
    Draw(temperature=1.0, seed=SEED_MAX)


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        ({"top_k": -5}, "top_k"),  # defect 7
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "9"}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"n": 1000}, "n"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": ""}, "stop"),
        ({"stop": 3}, "stop"),
        ({"stream": "yes"}, "stream"),
        ({"logprobs": 6}, "logprobs"),
        ({"echo": 1}, "echo"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"colour": 1}, "colour"),
    ],
)
def test_out_of_range_and_wrong_types_name_the_field(kw, param) -> None:
    refused(lambda: comp(**kw), param, param=param)


@pytest.mark.parametrize(
    "kw",
    [
        {"logit_bias": {"50": 10}},
        {"suffix": "end"},
        {"best_of": 3},
        {"presence_penalty": 0.5},
        {"frequency_penalty": -1},
    ],
)
def test_unsupported_completion_fields_are_refused_by_name(kw) -> None:  # defect 7
    (name,) = kw
    refused(lambda: comp(**kw), name, "not supported")


@pytest.mark.parametrize(
    "kw",
    [
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        {"tool_choice": "auto"},
        {"response_format": {"type": "json_object"}},
        {"logit_bias": {"1": 1}},
        {"functions": [{"name": "f"}]},
        {"audio": {"voice": "x"}},
        {"store": True},
    ],
)
def test_unsupported_chat_fields_are_refused_by_name(kw) -> None:  # defect 7
    (name,) = kw
    refused(lambda: chat([{"role": "user", "content": "hi"}], **kw), name, "not supported")


def test_neutral_values_of_unsupported_fields_are_accepted() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    chat(msgs, tools=[], tool_choice="none", response_format={"type": "text"}, logit_bias={})
    chat(msgs, presence_penalty=0, frequency_penalty=0.0, store=False, user="u1")
    comp(best_of=1, suffix="", echo=True, logprobs=None)


def test_tool_calls_in_the_history_are_accepted() -> None:
    msgs = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    req = chat(msgs)
    rendered = [m.for_template() for m in req.messages]
    assert rendered[1]["tool_calls"][0]["function"]["name"] == "w"
    assert rendered[2]["tool_call_id"] == "c1"
    refused(lambda: chat([{"role": "tool", "content": "x"}]), "tool_call_id")
    refused(lambda: chat([{"role": "user", "content": None}]), "content")
    refused(lambda: chat([]), param="messages")
    refused(lambda: chat([{"role": "wizard", "content": "x"}]), "role")
    refused(lambda: chat([{"role": "user", "content": [{"type": "image_url"}]}]))


def test_bodies_the_json_parser_refuses() -> None:  # defect 4
    refused(lambda: parse(CompletionRequest, b'{"model": "m", "prompt": "a\\ud800b"}'), "JSON")
    deep = b'{"model": "m", "prompt": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    refused(lambda: parse(CompletionRequest, deep), "JSON")
    refused(lambda: parse(CompletionRequest, b"[1, 2]"), "object")
    refused(lambda: parse(CompletionRequest, b"{not json"), "JSON")
    refused(lambda: parse(CompletionRequest, b'{"prompt": "x"}'), "model", param="model")


def test_to_sampling_params_is_the_one_mapping() -> None:
    p = comp(max_tokens=5, temperature=0.5, top_p=0.9, top_k=-1, seed=7, ignore_eos=True)
    sp = p.to_sampling_params(prompt_len=3, limit=100, default_max=16)
    assert (sp.max_tokens, sp.temperature, sp.top_p, sp.top_k, sp.seed, sp.ignore_eos) == (
        5, 0.5, 0.9, 0, 7, True,
    )  # fmt: skip
    # n choices get distinct seeds, wrapped into int64 at the edge
    seeds = [comp(seed=SEED_MAX, n=3).to_sampling_params(3, 100, 16, i).seed for i in range(3)]
    assert seeds == [SEED_MAX, SEED_MIN, SEED_MIN + 1]
    assert comp().to_sampling_params(3, 100, 16).max_tokens == 16
    assert comp().to_sampling_params(90, 100, 16).max_tokens == 10  # default fits the room
    c = chat([{"role": "user", "content": "x"}], max_tokens=3, max_completion_tokens=9)
    assert c.to_sampling_params(3, 100, 256).max_tokens == 9
    e = refused(lambda: comp(max_tokens=50).to_sampling_params(60, 100, 16), "context")
    assert e.code == "context_length_exceeded"
    e = refused(lambda: comp().to_sampling_params(0, 100, 16), "empty", param="prompt")
    assert e.code is None  # defect 7: not context_length_exceeded


def test_prompt_forms() -> None:
    assert comp(prompt="x").prompts == ["x"]
    assert comp(prompt=[1, 2]).prompts == [[1, 2]]
    assert comp(prompt=["a", "b"]).prompts == ["a", "b"]
    assert comp(prompt=[[1], [2, 3]]).prompts == [[1], [2, 3]]
    refused(lambda: comp(prompt=5), param="prompt")
    refused(lambda: comp(prompt=[1, "a"]), param="prompt")


def test_what_load_clients_send_is_accepted() -> None:
    """GuideLLM's streaming chat body (vLLM extensions: ignore_eos, continuous usage)."""
    body = {
        "model": "m",
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "max_completion_tokens": 16,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
    }
    req = ChatRequest.model_validate(body)
    assert req.include_usage and req.continuous_usage and req.ignore_eos
    assert req.messages[0].text == "hello"


@pytest.mark.parametrize(
    ("fn", "words", "param"),
    [
        # A union's first branch ("a valid string") hid what was wrong (walked: userpath).
        (lambda: comp(stop=["a", "b", "c", "d", "e"]), ["at most 4 items"], "stop"),
        (
            lambda: chat([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
            ["Input should be 'text'"],
            "messages.0.content.0.type",
        ),
        # NaN and infinities: "less than or equal to 2" for NaN said nothing useful.
        (lambda: comp(temperature=float("nan")), ["finite number"], "temperature"),
        (lambda: comp(top_p=float("inf")), ["finite number"], "top_p"),
        (lambda: comp(presence_penalty=float("-inf")), ["finite number"], "presence_penalty"),
    ],
)
def test_the_message_says_what_is_wrong(fn, words, param) -> None:
    refused(fn, *words, param=param)
