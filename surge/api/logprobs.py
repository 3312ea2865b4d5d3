"""Log-probabilities in OpenAI's two shapes.

What flows: a request's `logprobs` (output position -> `TokenLogprobs`, filled by the
endpoints from the engine's sampler) and token ids -> the `logprobs` object of a
completion choice (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`) or of a
chat choice (`content`: token, logprob, bytes, top_logprobs). A position without
log-probabilities (a token made by a KV migration) gets null. Owned by the API layer.
"""

from typing import Any

from surge.engine.sampling import TokenLogprobs


def token_text(tokenizer: Any, token_id: int) -> str:
    """One token's own text (a byte of a multi-byte character shows as U+FFFD)."""
    if tokenizer is None:
        return f" {token_id}"
    return tokenizer.decode([token_id], skip_special_tokens=False)


class CompletionLogprobs:
    """Builds completions' `logprobs` objects, keeping each choice's text offset."""

    def __init__(self, tokenizer: Any, offset: int = 0) -> None:
        self.tokenizer, self.offset = tokenizer, offset

    def __call__(
        self, ids: list[int], lps: dict[int, TokenLogprobs], start: int, end: int
    ) -> dict[str, Any]:
        out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                               "text_offset": []}  # fmt: skip
        for pos in range(start, end):
            text = token_text(self.tokenizer, ids[pos])
            lp = lps.get(pos)
            out["tokens"].append(text)
            out["token_logprobs"].append(lp.logprob if lp else None)
            top = {token_text(self.tokenizer, t): v for t, v in lp.top} if lp else None
            out["top_logprobs"].append(top)
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out


def chat_logprobs(
    tokenizer: Any, ids: list[int], lps: dict[int, TokenLogprobs], start: int, end: int
) -> dict[str, Any]:
    content = []
    for pos in range(start, end):
        text = token_text(tokenizer, ids[pos])
        lp = lps.get(pos)
        top = []
        for t, v in lp.top if lp else ():
            alt = token_text(tokenizer, t)
            top.append({"token": alt, "logprob": v, "bytes": list(alt.encode())})
        content.append(
            {
                "token": text,
                "logprob": lp.logprob if lp else None,
                "bytes": list(text.encode()),
                "top_logprobs": top,
            }
        )
    return {"content": content, "refusal": None}
