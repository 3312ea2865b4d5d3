"""A deployment's chat template is read and compiled once, not per request (defect 9)."""

import json
from pathlib import Path

from surge.api.chat import ChatTemplates


def test_template_is_compiled_once_per_deployment(tmp_path: Path) -> None:
    store = tmp_path / "m"
    store.mkdir()
    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}>"
    (store / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    templates = ChatTemplates(tmp_path)
    dep = object()
    msgs = [{"role": "user", "content": "hi"}]
    for _ in range(5):
        assert templates.get("m", dep).render(msgs) == "[user] hi\n>"
    assert templates.loads == 1
    (store / "tokenizer_config.json").write_text(json.dumps({"chat_template": "x"}))
    assert templates.get("m", dep).render(msgs) == "[user] hi\n>"  # still the compiled one
    assert templates.get("m", object()).render(msgs) == "x"  # a redeploy reloads
    assert templates.loads == 2


def test_no_template_uses_the_simple_one(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    out = ChatTemplates(tmp_path).get("m", object()).render([{"role": "user", "content": "a"}])
    assert out == "<|user|>\na\n<|assistant|>\n"
