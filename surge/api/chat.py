"""Turning chat messages into a prompt, with a template compiled once per deployment.

A store whose checkpoint came with a `tokenizer_config.json` holding a `chat_template` is
rendered with that (Jinja2, sandboxed, as Hugging Face does; tool calls and tool results
in the history reach it as `tool_calls` / `tool_call_id`). Otherwise surge's simple
template is used, one block per message and an open assistant block at the end:

    <|system|>
    You are terse.
    <|user|>
    Hello!
    <|assistant|>

(the markers are plain text to the tokenizer). `ChatTemplates` keeps each deployment's
compiled template beside it, so a request only renders. Owned by the API layer.
"""

import json
from pathlib import Path
from typing import Any

from surge.errors import SurgeError


def _simple_text(m: dict[str, Any]) -> str:
    text = m.get("content") or ""
    for call in m.get("tool_calls") or ():
        fn = call["function"]
        text += f"[call {call['id']}: {fn['name']}({fn['arguments']})]"
    if m.get("tool_call_id"):
        text = f"[result {m['tool_call_id']}] {text}"
    return text


def simple_template(messages: list[dict[str, Any]]) -> str:
    body = "".join(f"<|{m['role']}|>\n{_simple_text(m)}\n" for m in messages)
    return body + "<|assistant|>\n"


def load_chat_template(store_dir: Path) -> str | None:
    cfg = store_dir / "tokenizer_config.json"
    if not cfg.is_file():
        return None
    try:
        template = json.loads(cfg.read_text()).get("chat_template")
    except (OSError, ValueError):
        return None
    return template if isinstance(template, str) else None


class ChatTemplate:
    """One model's chat template, compiled (None: surge's simple template)."""

    def __init__(self, source: str | None) -> None:
        self.compiled: Any = None
        if source is not None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            try:
                self.compiled = env.from_string(source)
            except Exception as e:  # a broken template in a checkpoint is the model's problem
                raise SurgeError(f"the model's chat template does not compile: {e}") from None

    def render(self, messages: list[dict[str, Any]]) -> str:
        if self.compiled is None:
            return simple_template(messages)
        try:
            return self.compiled.render(messages=messages, add_generation_prompt=True)
        except Exception as e:
            raise SurgeError(f"the model's chat template failed: {e}") from None


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
        template = ChatTemplate(load_chat_template(self.registry / name))
        self.loads += 1
        self._by_name[name] = (deployment, template)
        return template
