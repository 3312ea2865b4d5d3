"""Chat templates as Hugging Face and vLLM apply them: where the template comes from (the
deployment's, chat_template.jinja, tokenizer_config.json, or none: a 400), what a template
sees (special tokens, raise_exception, tojson), compiled once per deployment (defect 9)."""

import json
from pathlib import Path
from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from surge.api.app import create_app
from surge.api.chat import ChatTemplate, ChatTemplates
from surge.errors import InvalidInput
from surge.model.tiny import SIMPLE_CHAT_TEMPLATE

MSGS = [{"role": "user", "content": "hi"}]


def _store(tmp_path: Path, name: str = "m", **files: str) -> Path:
    store = tmp_path / name
    store.mkdir()
    for file, text in files.items():
        (store / file.replace("__", ".")).write_text(text)
    return store


def test_template_is_compiled_once_per_deployment(tmp_path: Path) -> None:
    store = _store(tmp_path)
    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}>"
    (store / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    templates = ChatTemplates(tmp_path)
    dep = object()
    for _ in range(5):
        assert templates.get("m", dep).render(MSGS) == "[user] hi\n>"
    assert templates.loads == 1
    (store / "tokenizer_config.json").write_text(json.dumps({"chat_template": "x"}))
    assert templates.get("m", dep).render(MSGS) == "[user] hi\n>"  # still the compiled one
    assert templates.get("m", object()).render(MSGS) == "x"  # a redeploy reloads
    assert templates.loads == 2


def test_chat_template_jinja_comes_first_then_tokenizer_config(tmp_path: Path) -> None:
    cfg = json.dumps({"chat_template": "from config"})
    _store(tmp_path, "both", chat_template__jinja="from jinja", tokenizer_config__json=cfg)
    _store(tmp_path, "cfg", tokenizer_config__json=cfg)
    named = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "dflt"}]
    _store(tmp_path, "named", tokenizer_config__json=json.dumps({"chat_template": named}))
    t = ChatTemplates(tmp_path)
    assert t.get("both", object()).render(MSGS) == "from jinja"
    assert t.get("cfg", object()).render(MSGS) == "from config"
    assert t.get("named", object()).render(MSGS) == "dflt"
    # A deployment that names a template uses it, whatever the store ships.
    dep = SimpleNamespace(spec=SimpleNamespace(chat_template="mine {{ messages[0].content }}"))
    assert t.get("both", dep).render(MSGS) == "mine hi"


def test_no_template_is_a_400_naming_the_fix(tmp_path: Path) -> None:
    _store(tmp_path)
    with pytest.raises(InvalidInput, match=r"has no chat template.*--chat-template FILE"):
        ChatTemplates(tmp_path).get("m", object()).render(MSGS)


def test_template_sees_what_transformers_gives_it(tmp_path: Path) -> None:
    specials = {"bos_token": {"content": "<s>", "special": True}, "eos_token": "</s>"}
    source = (
        "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}"
        "{{ raise_exception('no system role') }}{% endif %}{{ m.content | tojson }}"
        "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}>{% endif %}"
    )
    _store(tmp_path, tokenizer_config__json=json.dumps(specials), chat_template__jinja=source)
    t = ChatTemplates(tmp_path).get("m", object())
    assert t.render([{"role": "user", "content": "a<b>&é"}]) == '<s>"a<b>&é"</s>>'
    with pytest.raises(InvalidInput, match="no system role"):
        t.render([{"role": "system", "content": "x"}])


def test_tiny_models_template_is_the_plain_one() -> None:
    msgs = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello!"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": '{"x": 1}'}}],
        },
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ]
    assert ChatTemplate(SIMPLE_CHAT_TEMPLATE).render(msgs) == (
        "<|system|>\nYou are terse.\n<|user|>\nHello!\n"
        '<|assistant|>\n[call c1: f({"x": 1})]\n<|tool|>\n[result c1] 42\n<|assistant|>\n'
    )


def test_chat_without_a_template_answers_400_over_http(tmp_path: Path) -> None:
    _store(tmp_path)
    controller = MagicMock()
    controller.metrics.registry = CollectorRegistry()
    controller.registry = tmp_path
    controller.deployment.return_value = SimpleNamespace(name="m", spec=SimpleNamespace(
        chat_template=None), tokenizer=MagicMock())  # fmt: skip
    r = TestClient(create_app(controller)).post(
        "/v1/chat/completions", json={"model": "m", "messages": MSGS}
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "has no chat template" in err["message"] and err["param"] == "messages"
    controller.submit.assert_not_called()
