"""OpenAI conformance, fuzzed: schemathesis generates requests from the OpenAI OpenAPI spec
(`../shared/specs/openai/openapi.yaml`, restricted to GET /v1/models, POST /v1/completions
and POST /v1/chat/completions) and from surge's own `/openapi.json`, and sends them to a live
`surge serve`. What must hold for every one: no server error (5xx), no hang (each answer
within a bound), and a response that matches the spec for every request surge accepts.

Bounded: a fixed number of examples per operation, small `max_tokens`, derandomized so a
failure reproduces."""

from collections.abc import Iterator
from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis")

from tests.conftest import REPO  # noqa: E402
from tests.control.conftest import Serve, start_serve  # noqa: E402

SPEC = REPO.parent / "shared" / "specs" / "openai" / "openapi.yaml"
MODEL = "surge-tiny"
EXAMPLES_PER_OPERATION = 40
ANSWER_BOUND_S = 60.0


@pytest.fixture(scope="module")
def server(tmp_path_factory, surge_home: Path, tiny_store_dir: Path) -> Iterator[Serve]:
    config = {
        "nodes": 1,
        "deployments": [
            {"name": MODEL, "model": str(tiny_store_dir), "autoscaling": {"min_replicas": 1}}
        ],
    }
    s = start_serve(tmp_path_factory.mktemp("conformance"), surge_home, config)
    yield s
    s.stop()


def _bounded(case) -> None:
    """Aim generated requests at the served model and keep generations short."""
    if isinstance(case.body, dict):
        if "model" in case.body or case.path.endswith("completions"):
            case.body["model"] = MODEL
        for key in ("max_tokens", "max_completion_tokens"):
            if isinstance(case.body.get(key), int) and case.body[key] > 16:
                case.body[key] = 16
        if isinstance(case.body.get("n"), int) and case.body["n"] > 2:
            case.body["n"] = 2


KEPT_FIELDS = {
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
    "top_p", "seed", "stop", "n", "echo", "logprobs", "top_logprobs", "user",
}  # fmt: skip
"""What a shaped request keeps of a generated one (fields surge documents as supported)."""


def _shaped(case) -> None:
    """Keep only fields surge supports, with no nulls, so that most requests are accepted
    and their answers are checked against the spec (the raw run mostly meets 400s)."""
    if not isinstance(case.body, dict):
        return
    body = {k: v for k, v in case.body.items() if k in KEPT_FIELDS and v is not None}
    if case.path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "Say something."}]
    else:
        body["prompt"] = "Once upon a time"
    case.body = body
    _bounded(case)


def _operation_check(op, base_url: str, problems: list[str], accepted: list[str], shape):
    """A hypothesis test sending `EXAMPLES_PER_OPERATION` generated requests to `op`."""
    from hypothesis import HealthCheck, Phase, given, settings

    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=op.as_strategy())
    def check(case) -> None:
        shape(case)
        try:
            response = case.call(base_url=base_url, timeout=ANSWER_BOUND_S)
        except Exception as e:  # a hang or a dropped connection
            problems.append(f"{op.label}: {type(e).__name__} for {case.body!r:.300}")
            return
        if response.status_code >= 500:
            problems.append(f"{op.label}: {response.status_code} for {case.body!r:.300}")
        elif response.status_code < 300:
            accepted.append(op.label)
            try:
                case.validate_response(
                    response, checks=[schemathesis.checks.response_schema_conformance]
                )
            except Exception as e:  # the answer breaks the spec
                first = str(e).strip().splitlines()[0]
                problems.append(f"{op.label}: {first} for {case.body!r:.300}")

    return check


def _fuzz(schema, base_url: str, shape=_bounded) -> tuple[list[str], list[str]]:
    """Every operation of `schema`, `EXAMPLES_PER_OPERATION` generated requests each; the
    problems found (empty when all hold) and the operations of the accepted requests."""

    problems: list[str] = []
    accepted: list[str] = []
    for result in schema.get_all_operations():
        _operation_check(result.ok(), base_url, problems, accepted, shape)()
    return problems, accepted


@pytest.mark.skipif(
    not SPEC.is_file(),
    reason=f"OpenAI's OpenAPI spec is not beside this clone ({SPEC}: ../shared/specs)",
)
def test_openai_spec_fuzzed_against_surge_serve(server: Serve) -> None:
    schema = schemathesis.openapi.from_path(SPEC)
    schema = schema.include(path_regex=r"^/(models|completions|chat/completions)$")
    schema = schema.exclude(method="GET", path="/chat/completions")  # stored completions
    problems, _ = _fuzz(schema, server.url + "/v1")
    assert problems == []
    problems, accepted = _fuzz(schema, server.url + "/v1", shape=_shaped)
    assert problems == []
    for label in ("POST /completions", "POST /chat/completions", "GET /models"):
        assert accepted.count(label) >= EXAMPLES_PER_OPERATION // 4, (label, accepted)


def test_surges_own_openapi_fuzzed(server: Serve) -> None:
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    schema = schema.exclude(method="DELETE")  # the module's one deployment stays
    problems, _ = _fuzz(schema, server.url)
    assert problems == []
