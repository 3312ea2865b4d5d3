"""Turning chat messages into a prompt, as Hugging Face and vLLM do, compiled once per
deployment.

The template is, in order: the one the deployment names (`surge serve --chat-template FILE`,
`DeploymentSpec.chat_template`), the store's `chat_template.jinja` (transformers' layout since
4.50), or `chat_template` in its `tokenizer_config.json` (a string, or a list of named ones:
`default` is used). A model with none cannot chat: `/v1/chat/completions` answers 400 saying
so (as vLLM does). Compiled by `surge.model.chat_template` (a sandboxed Jinja environment
with transformers' `raise_exception`, `strftime_now` and `tojson`; a template the deployment
names was compiled there once already, when it was made), rendered with `messages` (tool
calls and results as `tool_calls` / `tool_call_id`), `add_generation_prompt=True` and the
special tokens' text (`bos_token`, `eos_token`, ...). The rendered text is tokenized
without the tokenizer's own BOS/EOS (`add_special_tokens=False`): the template writes its own.
`ChatTemplates` keeps each deployment's compiled template beside it, so a request only
renders. Owned by the API layer.
"""

import json
from pathlib import Path
from typing import Any

from surge.errors import InvalidInput, SurgeError
from surge.model.chat_template import compile_chat_template

TEMPLATE_FILE = "chat_template.jinja"
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


def _tokenizer_config(store_dir: Path) -> dict[str, Any]:
    try:
        cfg = json.loads((store_dir / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


def load_chat_template(store_dir: Path) -> str | None:
    """The store's own chat template: `chat_template.jinja`, else tokenizer_config.json's."""
    try:
        return (store_dir / TEMPLATE_FILE).read_text()
    except OSError:
        pass
    template = _tokenizer_config(store_dir).get("chat_template")
    if isinstance(
        template, list
    ):  # [{"name": "default", "template": ...}, {"name": "tool_use"...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def special_tokens(store_dir: Path) -> dict[str, str]:
    """The special tokens' text a template may write (`{{ bos_token }}`)."""
    out = {}
    for key, value in _tokenizer_config(store_dir).items():
        if key in SPECIAL_TOKEN_KEYS:
            text = value.get("content") if isinstance(value, dict) else value
            if isinstance(text, str):
                out[key] = text
    return out


class ChatTemplate:
    """One model's chat template, compiled (None: the model has none)."""

    def __init__(
        self, source: str | None, specials: dict[str, str] | None = None, model: str = ""
    ) -> None:
        self.model = model
        self.specials = specials or {}
        self.compiled: Any = None
        if source is not None:
            try:
                self.compiled = compile_chat_template(source)
            except SurgeError as e:  # a broken template in a checkpoint is the model's problem
                raise SurgeError(f"the model's chat template {e}") from None

    def render(self, messages: list[dict[str, Any]]) -> str:
        if self.compiled is None:
            raise InvalidInput(
                f"model {self.model!r} has no chat template (its checkpoint ships no "
                f"{TEMPLATE_FILE} and no chat_template in tokenizer_config.json); use "
                "/v1/completions, or deploy it with one: surge serve --chat-template FILE",
                param="messages",
            )
        try:
            return self.compiled.render(
                messages=messages, add_generation_prompt=True, **self.specials
            )
        except Exception as e:
            raise InvalidInput(f"the model's chat template failed: {e}", param="messages") from None


class ChatTemplates:
    """Each deployment's compiled template, loaded on its first chat request and kept
    while that deployment object lives (a redeploy under the same name reloads)."""

    def __init__(self, registry: Path) -> None:
        self.registry = registry
        self._by_name: dict[str, tuple[object, ChatTemplate]] = {}
        self.loads = 0
        """How many templates were loaded and compiled (a test reads it)."""

    def get(self, name: str, deployment: object) -> ChatTemplate:
        hit = self._by_name.get(name)
        if hit is not None and hit[0] is deployment:
            return hit[1]
        store = self.registry / name
        spec = getattr(deployment, "spec", None)
        source = getattr(spec, "chat_template", None) or load_chat_template(store)
        template = ChatTemplate(source, special_tokens(store), name)
        self.loads += 1
        self._by_name[name] = (deployment, template)
        return template
