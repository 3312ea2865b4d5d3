"""The OpenAI wire format of /v1/completions and /v1/chat/completions, as pydantic models.

What flows: a request body (raw bytes) -> `parse(Model, raw)` -> a validated request model
-> `to_sampling_params` (the one place API fields become engine `SamplingParams`). Fields
follow OpenAI's spec (`../shared/specs/openai/openapi.yaml`) with strict types (no "9"
for 9, no true for 1) and ranges; vLLM's `top_k`/`ignore_eos` are extensions. Fields the
spec defines but surge does not implement are declared so that a value other than the
neutral one gets a 400 naming the field (`unsupported`), never ignored silently; fields
the spec does not define get a 400 too (OpenAI's "Unrecognized request argument").
Owned by the API layer.
"""

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from surge.engine.sampling import SEED_MAX, SEED_MIN, SamplingParams
from surge.errors import InvalidInput

MAX_STOP = 4
"""OpenAI: up to 4 stop sequences."""
MAX_CHOICES = 16
"""Most choices one request may ask for (`n` times the number of prompts)."""
MAX_LOGPROBS = 5
"""OpenAI's cap on completions' `logprobs`."""
MAX_TOP_LOGPROBS = 20
"""OpenAI's cap on chat's `top_logprobs`."""
DEFAULT_COMPLETION_TOKENS = 16
"""OpenAI's default `max_tokens` for /v1/completions."""
DEFAULT_CHAT_TOKENS = 256
"""Default for chat when neither max_tokens nor max_completion_tokens is given."""

M = TypeVar("M", bound=BaseModel)
Seed = Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX)]
StopText = Annotated[str, Field(min_length=1)]


class _Strict(BaseModel):
    # allow_inf_nan=False: a NaN or an infinity is "not a finite number", not "not <= 2".
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False
    """A last chunk with the request's usage (OpenAI)."""
    continuous_usage_stats: bool = False
    """vLLM's extension (load clients such as GuideLLM send it): every chunk carries the
    usage so far."""


class _Sampling(_Strict):
    """The fields both endpoints share."""

    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    """vLLM's extension: -1 or 0 is no limit, else keep the k most likely tokens."""
    seed: Seed | None = None
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] | None = None
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOP)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    """An end-user id: accepted, as OpenAI takes it (surge keeps no per-user state)."""
    ignore_eos: bool = False
    """vLLM's extension: keep generating past the end-of-sequence token."""
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    logit_bias: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        unsupported(self, NEUTRAL)
        return self

    @property
    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)

    @property
    def num_choices(self) -> int:
        return self.n or 1

    def max_new_tokens(self) -> int | None:
        return self.max_tokens

    def to_sampling_params(
        self, prompt_len: int, limit: int, default_max: int, index: int = 0
    ) -> SamplingParams:
        """The engine settings of choice `index`, for a prompt of `prompt_len` tokens and a
        model context of `limit` tokens. With a seed, choice i gets seed + i (wrapped into
        int64), so n > 1 choices differ but the request stays reproducible."""
        if prompt_len < 1:
            raise InvalidInput("the prompt is empty; send at least one token", param="prompt")
        room = limit - prompt_len
        max_tokens = self.max_new_tokens()
        if max_tokens is None:
            max_tokens = min(default_max, room)
        if max_tokens > room or room < 1:
            raise InvalidInput(
                f"max_tokens {max_tokens} + the prompt's {prompt_len} tokens exceed the "
                f"model's context of {limit} tokens; ask for at most {max(room, 0)}",
                param="max_tokens",
                code="context_length_exceeded",
            )
        seed = self.seed
        if seed is not None and index:
            seed = (seed + index - SEED_MIN) % (SEED_MAX - SEED_MIN + 1) + SEED_MIN
        temperature = 1.0 if self.temperature is None else self.temperature
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=max(0, self.top_k or 0),
            seed=seed,
            ignore_eos=self.ignore_eos,
            logprobs=self.wanted_logprobs(),
        ).validate()

    def wanted_logprobs(self) -> int | None:
        """How many alternatives per token the engine reports (None: no logprobs)."""
        return None


NEUTRAL: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "suffix": (None, ""),
    "best_of": (None, 1),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "parallel_tool_calls": (None,),
    "functions": (None, []),
    "function_call": (None, "none"),
    "response_format": (None, {"type": "text"}),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "verbosity": (None,),
    "web_search_options": (None,),
    "service_tier": (None, "auto", "default"),
    "store": (None, False),
    "metadata": (None, {}),
    "moderation": (None,),
    "prompt_cache_key": (None,),
    "prompt_cache_options": (None,),
    "prompt_cache_retention": (None,),
    "safety_identifier": (None,),
}
"""Spec fields surge does not implement, with the values that ask for nothing."""


def unsupported(model: BaseModel, neutral: dict[str, tuple[Any, ...]]) -> None:
    """A 400 naming the first field set to something surge would have to ignore."""
    for name, ok in neutral.items():
        v = getattr(model, name, None)
        if not any(_same(v, o) for o in ok):
            raise ValueError(f"{name} is not supported by surge; leave it out")


def _same(v: Any, o: Any) -> bool:
    if o is None or v is None:
        return v is o
    numbers = (int, float)
    if type(v) in numbers and type(o) in numbers:
        return v == o
    return type(v) is type(o) and v == o


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    suffix: str | None = None
    best_of: int | None = None

    @model_validator(mode="after")
    def _completion(self):
        if self.echo and self.logprobs is not None:
            raise ValueError("logprobs with echo is not supported (prompt logprobs); pick one")
        return self

    def wanted_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and isinstance(p[0], int):
            return [list(p)]  # type: ignore[arg-type]
        if not p:
            return [[]]
        return list(p)  # type: ignore[arg-type]


class ToolFunction(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str
    arguments: str


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    id: str
    type: Literal["function"] = "function"
    function: ToolFunction


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class Message(BaseModel):
    """One chat message. Tool calls and tool results in the history are rendered into the
    prompt by the model's chat template (surge does not call tools itself)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None

    @model_validator(mode="after")
    def _check(self):
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        return self

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)

    def for_template(self) -> dict[str, Any]:
        """The dict a Hugging Face chat template expects."""
        d: dict[str, Any] = {"role": self.role, "content": self.text}
        if self.name is not None:
            d["name"] = self.name
        if self.tool_calls:
            d["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        return d


class ChatRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: Any = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    service_tier: Any = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    moderation: Any = None
    prompt_cache_key: Any = None
    prompt_cache_options: Any = None
    prompt_cache_retention: Any = None
    safety_identifier: str | None = None

    @model_validator(mode="after")
    def _chat(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def wanted_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def max_new_tokens(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


def parse(model: type[M], raw: bytes) -> M:
    """Validate a raw JSON body; any problem is an `InvalidInput` naming the field. The
    JSON parser refuses lone surrogates and bodies nested too deep, so neither reaches
    the tokenizer or Python's recursion limit."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        raise invalid_input(e) from None


def invalid_input(e: ValidationError) -> InvalidInput:
    err = _telling(e.errors(include_url=False))
    # A union reports which branch failed ("int", "list[str]", "Message", ...): the
    # caller needs the field names and list indices only.
    param = ".".join(str(x) for x in err["loc"] if not _branch_tag(x))
    loc = param
    kind, msg = err["type"], err["msg"]
    if kind == "json_invalid":
        return InvalidInput(f"the request body is not valid JSON: {msg}")
    if kind == "model_type" and not loc:
        return InvalidInput("the request body must be a JSON object")
    if kind == "extra_forbidden":
        return InvalidInput(f"unrecognized request argument {param!r}", param=param)
    if kind == "missing":
        return InvalidInput(f"{param} is required", param=param)
    msg = msg.removeprefix("Value error, ")
    if not param:
        return InvalidInput(msg, param=_named(msg))
    return InvalidInput(f"{param}: {msg}", param=param)


def _telling(errors: list[Any]) -> Any:
    """The error to report: of the first bad field's errors, the first that is not a type
    mismatch. A union reports each branch, and its first (`stop`: "a valid string") hid the
    one the value took (`stop`: a list of 5, "at most 4 items")."""
    first = errors[0]
    field = first["loc"][:1]
    for err in errors:
        if err["loc"][:1] == field and not err["type"].endswith("_type"):
            return err
    return first


_TYPE_TAGS = frozenset({"bool", "int", "float", "str", "dict", "list", "none"})


def _branch_tag(x: str | int) -> bool:
    if isinstance(x, int):
        return False
    return x in _TYPE_TAGS or "[" in x or "-" in x or x[:1].isupper()


def _named(msg: str) -> str | None:
    """The field a model-level check names at the start of its message."""
    head = msg.split(" ", 1)[0]
    return head if head.isidentifier() and head not in ("a", "only") else None
