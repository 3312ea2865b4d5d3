"""`surge serve` end to end with the official openai client: models, completions and chat
(streaming and not, equal to a local greedy run), a burst on a scaled-to-zero model that
scales out and back to zero, and the thin-client commands; its `--stall-timeout-s` reaches
every agent it starts."""

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from tests.conftest import run_surge
from tests.control.conftest import Serve, start_serve

MODEL = "surge-tiny"
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}
STALL_FLAG = ("--stall-timeout-s", "7.5")

# One xdist worker runs every test of this module: the module's `surge serve` then starts once,
# not once on each worker that draws one of its tests.
pytestmark = pytest.mark.xdist_group("serve_openai")


@pytest.fixture(scope="module")
def server(tmp_path_factory, surge_home: Path, tiny_store_dir: Path) -> Iterator[Serve]:
    config = {
        "nodes": 4,
        "deployments": [
            {
                "name": MODEL,
                "model": str(tiny_store_dir),
                "autoscaling": {
                    "min_replicas": 0,
                    "target_ongoing_requests": 2,
                    "downscale_delay_s": 0.5,
                    "keep_alive_s": 1.5,
                },
            }
        ],
    }
    # A stall timeout given as a flag (not the default 8 s) reaches every agent it starts.
    s = start_serve(tmp_path_factory.mktemp("serve"), surge_home, config, *STALL_FLAG)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server: Serve) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def wait_for(cond, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_list_models(client) -> None:
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_the_server_process_runs_no_model_so_never_loads_torch(server) -> None:
    """Up, with a deployment and before any scale-out: `surge serve`'s own process (the
    controller, the API) has not imported torch (~1.5 s of CPU); its agents run the models.
    A pipeline's head engine, when λScale opens one later, imports it then."""
    maps = Path(f"/proc/{server.proc.pid}/maps")
    if not maps.is_file():
        pytest.skip("no /proc here to read the server's loaded libraries from")
    assert "libtorch" not in maps.read_text()


def test_the_stall_timeout_flag_reaches_every_agent(server) -> None:
    for pid in server.agent_pids:
        argv = psutil.Process(pid).cmdline()
        assert argv[argv.index(STALL_FLAG[0]) + 1] == STALL_FLAG[1], argv


def test_completion_and_chat_streaming_and_not(client, reference) -> None:
    prompt = "The quick brown fox"
    want = reference(prompt, 12)
    c = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, **GREEDY)
    assert c.choices[0].text == want
    assert c.choices[0].finish_reason == "length"
    assert c.usage.completion_tokens == 12 and c.usage.prompt_tokens > 0
    stream = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=12, stream=True, **GREEDY
    )
    assert "".join(ch.choices[0].text for ch in stream if ch.choices) == want

    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    chat_prompt = "<|system|>\nBe brief.\n<|user|>\nHello!\n<|assistant|>\n"
    want_chat = reference(chat_prompt, 10)
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=10, **GREEDY)
    assert r.choices[0].message.content == want_chat
    assert r.choices[0].message.role == "assistant"
    assert r.usage.total_tokens == r.usage.prompt_tokens + 10
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=msgs,
            max_tokens=10,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == want_chat
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10


def test_sampling_knobs_and_stop(client) -> None:
    kw = {"model": MODEL, "prompt": "Hello world", "max_tokens": 16, "temperature": 0.9}
    a = client.completions.create(**kw, top_p=0.9, seed=7).choices[0].text
    b = client.completions.create(**kw, top_p=0.9, seed=7).choices[0].text
    assert a == b, "a seeded request must give the same text"
    full = client.completions.create(model=MODEL, prompt="Hello", max_tokens=16, **GREEDY)
    text = full.choices[0].text
    stop = text[3:5]
    if stop.strip() and "\ufffd" not in stop:
        cut = client.completions.create(
            model=MODEL, prompt="Hello", max_tokens=16, stop=[stop], **GREEDY
        )
        assert cut.choices[0].text == text[: text.find(stop)]
        assert cut.choices[0].finish_reason == "stop"


def test_burst_on_a_scaled_to_zero_model_scales_out_and_back(server, reference) -> None:
    wait_for(lambda: server.metric("surge_instances", MODEL) == 0, 30, "scale to zero")
    prompts = [f"Request {i}: once upon a time" for i in range(12)]
    # Long enough that the first instance cannot finish the burst before the autoscaler's
    # next tick sees it (48 tokens could, on a fast run: the activator's first decision
    # may see only the first request).
    num_tokens = 160
    peak = {"instances": 0.0, "capacity": 0.0, "samples": 0, "errors": 0}

    async def burst():
        aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        t0 = time.monotonic()
        first: list[float] = []

        async def one(p: str) -> str:
            stream = await aclient.completions.create(
                model=MODEL, prompt=p, max_tokens=num_tokens, stream=True, **GREEDY
            )
            parts = []
            async for ch in stream:
                if not first:
                    first.append(time.monotonic() - t0)
                parts.append(ch.choices[0].text if ch.choices else "")
            return "".join(parts)

        mon = asyncio.ensure_future(_poll(server, peak))
        try:
            outs = await asyncio.wait_for(asyncio.gather(*(one(p) for p in prompts)), 120)
        finally:
            if mon.done() and not mon.cancelled() and mon.exception() is not None:
                raise AssertionError(f"the metrics poller stopped: {mon.exception()!r}")
            mon.cancel()
        await aclient.close()
        return outs, first[0]

    outs, ttft = asyncio.run(burst())
    for p, out in zip(prompts, outs, strict=True):
        assert out == reference(p, num_tokens), p
    # Scaling out means the autoscaler brought up more capacity: instances serving, still
    # loading, or pipelines serving while loading (a short burst may end before they serve).
    assert peak["capacity"] >= 2, f"no scale-out seen: {peak}"
    assert server.metric("surge_scale_outs_total", MODEL) >= 1
    print(f"TTFT of the first request on a scaled-to-zero model: {ttft * 1000:.0f} ms")
    wait_for(lambda: server.metric("surge_instances", MODEL) == 0, 30, "scale back to zero")
    assert server.metric("surge_instances_released_total", MODEL) >= peak["instances"]


async def _poll(server: Serve, peak: dict) -> None:
    """Samples the three capacity gauges from one /metrics scrape every 50 ms. A scrape that
    fails (a loaded CI machine) is counted and retried, so one slow answer does not end the
    sampling; the counts go into the assertion's message."""
    names = ("surge_instances", "surge_instances_loading", "surge_pipelines")
    while True:
        try:
            text = await asyncio.to_thread(server.metrics_text)
        except httpx.HTTPError:
            peak["errors"] += 1
            await asyncio.sleep(0.2)
            continue
        n = [Serve.read_metric(text, name, MODEL) for name in names]
        peak["samples"] += 1
        peak["instances"] = max(peak["instances"], n[0])
        peak["capacity"] = max(peak["capacity"], sum(n))
        await asyncio.sleep(0.05)


def test_thin_clients_deploy_status_delete(server, tiny_store_dir, reference) -> None:
    env_args = ["--url", server.url]
    r = run_surge(
        "deploy", "second", "--model", str(tiny_store_dir), "--strategy", "paraserve", *env_args
    )
    assert r.returncode == 0, r.stderr
    assert "deployed second" in r.stdout
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    out = client.completions.create(model="second", prompt="Hi there", max_tokens=8, **GREEDY)
    assert out.choices[0].text == reference("Hi there", 8)
    r = run_surge("status", *env_args)
    assert r.returncode == 0 and "second" in r.stdout and "paraserve" in r.stdout, r.stderr
    dup = run_surge("deploy", "second", "--model", str(tiny_store_dir), *env_args)
    assert dup.returncode == 2 and "already exists" in dup.stderr
    assert len(dup.stderr.strip().splitlines()) == 1
    r = run_surge("delete", "second", *env_args)
    assert r.returncode == 0, r.stderr
    r = run_surge("delete", "second", *env_args)
    assert r.returncode == 2 and "no deployment" in r.stderr
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_n_choices_echo_and_prompt_batches(client, reference) -> None:
    kw = {"model": MODEL, "prompt": "Hello world", "max_tokens": 12, "temperature": 1.0}
    r = client.completions.create(**kw, n=3, seed=11)
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = [c.text for c in r.choices]
    assert len(set(texts)) > 1, "n choices with a seed get distinct seeds"
    again = client.completions.create(**kw, n=3, seed=11)
    assert [c.text for c in again.choices] == texts, "and stay reproducible"
    assert 3 <= r.usage.completion_tokens <= 36 and r.usage.prompt_tokens > 0
    streamed = client.completions.create(**kw, n=3, seed=11, stream=True)
    parts = ["", "", ""]
    for ch in streamed:
        for c in ch.choices:
            parts[c.index] += c.text
    assert parts == texts
    # echo puts the prompt before the answer; a batch of prompts gives a choice each
    want = reference("The quick brown fox", 6)
    e = client.completions.create(
        model=MODEL, prompt="The quick brown fox", max_tokens=6, echo=True, **GREEDY
    )
    assert e.choices[0].text == "The quick brown fox" + want
    b = client.completions.create(
        model=MODEL, prompt=["The quick brown fox", "Hello"], max_tokens=6, **GREEDY
    )
    assert [c.text for c in b.choices] == [want, reference("Hello", 6)]


def test_chat_history_with_tool_calls(client, reference) -> None:
    msgs = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    prompt = (
        "<|user|>\nWeather?\n<|assistant|>\n[call c1: w({})]\n<|tool|>\n[result c1] sunny\n"
        "<|assistant|>\n"
    )
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6, **GREEDY)
    assert r.choices[0].message.content == reference(prompt, 6)
    n2 = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6, n=2, **GREEDY)
    assert [c.message.content for c in n2.choices] == [reference(prompt, 6)] * 2


def test_logprobs_completions_and_chat(client) -> None:
    kw = {"model": MODEL, "max_tokens": 8, **GREEDY}
    c = client.completions.create(prompt="The quick brown fox", logprobs=2, **kw).choices[0]
    lp = c.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 8
    assert "".join(lp.tokens) == c.text
    assert all(v is not None and v <= 0 for v in lp.token_logprobs)
    # greedy picks the most likely token (two alternatives may decode to the same text,
    # e.g. halves of one character, and then share one key)
    assert all(1 <= len(top) <= 2 and max(top.values()) <= v + 1e-5
               for top, v in zip(lp.top_logprobs, lp.token_logprobs, strict=True))  # fmt: skip
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert client.completions.create(prompt="Hi", **kw).choices[0].logprobs is None

    msgs = [{"role": "user", "content": "Hello!"}]
    r = client.chat.completions.create(messages=msgs, logprobs=True, top_logprobs=3, **kw)
    content = r.choices[0].logprobs.content
    assert len(content) == 8 and all(len(t.top_logprobs) == 3 for t in content)
    assert "".join(t.token for t in content) == r.choices[0].message.content
    chunks = client.chat.completions.create(messages=msgs, logprobs=True, stream=True, **kw)
    streamed = [t for ch in chunks if ch.choices and ch.choices[0].logprobs
                for t in ch.choices[0].logprobs.content]  # fmt: skip
    # Same tokens; the values agree to float error only: the two requests may take different
    # attention paths (engine/attention.py: a prefix-cache hit, another batch shape).
    assert [t.token for t in streamed] == [t.token for t in content]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content], abs=1e-4)
