"""Turning chat messages into a prompt.

A store whose checkpoint came with a `tokenizer_config.json` holding a `chat_template` is
rendered with that (Jinja2, sandboxed, as Hugging Face does). Otherwise surge's simple
template is used, one block per message and an open assistant block at the end:

    <|system|>
    You are terse.
    <|user|>
    Hello!
    <|assistant|>

(the markers are plain text to the tokenizer).
"""

import json
from pathlib import Path
from typing import Any

from surge.errors import SurgeError

ROLES = ("system", "user", "assistant", "developer", "tool")


def message_text(content: Any) -> str:
    """The text of a message's `content`: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise SurgeError("only text content parts are supported ({'type': 'text', ...})")
            if not isinstance(part.get("text"), str):
                raise SurgeError("a text content part needs a string 'text'")
            parts.append(part["text"])
        return "".join(parts)
    raise SurgeError("message content must be a string or a list of text parts")


def check_messages(messages: Any) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise SurgeError("messages must be a non-empty list of {'role', 'content'} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise SurgeError(f"messages[{i}] must be an object")
        role = m.get("role")
        if role not in ROLES:
            raise SurgeError(f"messages[{i}].role must be one of {', '.join(ROLES)}")
        if "content" not in m or m["content"] is None:
            raise SurgeError(f"messages[{i}].content is missing")
        out.append({"role": role, "content": message_text(m["content"])})
    return out


def simple_template(messages: list[dict[str, str]]) -> str:
    body = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
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


def render(messages: list[dict[str, str]], template: str | None) -> str:
    if template is None:
        return simple_template(messages)
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        return env.from_string(template).render(messages=messages, add_generation_prompt=True)
    except Exception as e:  # a broken template in a checkpoint is the model's problem
        raise SurgeError(f"the model's chat template failed: {e}") from None
