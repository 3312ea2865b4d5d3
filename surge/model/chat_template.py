"""Compiling a chat template (Jinja) as Hugging Face's `apply_chat_template` and vLLM do.

What flows: a template's text -> `compile_chat_template` -> a compiled Jinja template, or one
`SurgeError` saying why it does not compile. One sandboxed environment with what transformers
gives a template: `raise_exception`, `strftime_now`, transformers' `tojson` (no HTML
escaping) and the `loopcontrols` extension. Used wherever a template enters: `surge serve
--chat-template FILE`, a new deployment's `chat_template` (config file, `POST
/v1/deployments`: `control/spec.new_deployment`) and the API's per-deployment cache
(`surge/api/chat.py`, which renders it). Here, beside the store's `chat_template.jinja`, so
that control/ and cli/ check a template without importing the API.
"""

import json
from datetime import datetime
from typing import Any

from surge.errors import SurgeError


def _raise_exception(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, **kw: Any) -> str:
    # transformers' tojson: no HTML escaping (Jinja's own escapes <, >, &, ').
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, **kw)


def compile_chat_template(source: str) -> Any:
    """`source` compiled (a `jinja2.Template`), or a `SurgeError`: "does not compile: ..."."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except Exception as e:  # TemplateSyntaxError, or an error of the compiler itself
        raise SurgeError(f"does not compile: {e}") from None
