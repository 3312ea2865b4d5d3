"""The `surge` command as a user runs it: outputs, and one-line errors with exit code 2."""

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from surge.engine.llm_engine import LLMEngine
from surge.engine.sampling import SamplingParams
from surge.model.tiny_shape import PRESETS
from tests.conftest import run_surge


def assert_one_line_error(proc, *fragments: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])


def test_help_lists_the_commands() -> None:
    proc = run_surge("--help")
    assert proc.returncode == 0
    for cmd in ("generate", "model", "plan"):
        assert cmd in proc.stdout
    proc = run_surge("model", "--help")
    assert "create-tiny" in proc.stdout and "import" in proc.stdout


def test_create_tiny_is_deterministic_and_honours_options(tmp_path: Path) -> None:
    args = [
        "--layers",
        "2",
        "--hidden",
        "64",
        "--heads",
        "4",
        "--kv-heads",
        "1",
        "--intermediate",
        "96",
        "--vocab",
        "300",
        "--seed",
        "3",
        "--dtype",
        "bfloat16",
    ]
    for d in ("a", "b"):
        proc = run_surge("model", "create-tiny", str(tmp_path / d), *args)
        assert proc.returncode == 0, proc.stderr
    for f in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json"):
        a, b = (hashlib.sha256((tmp_path / d / f).read_bytes()).digest() for d in "ab")
        assert a == b, f
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_key_value_heads"]) == (2, 64, 1)
    assert (cfg["intermediate_size"], cfg["vocab_size"], cfg["dtype"]) == (96, 300, "bfloat16")


def test_presets_have_the_advertised_sizes() -> None:
    def size_mb(c) -> float:
        d = c.hidden_size // c.num_heads
        layer = c.hidden_size * d * (2 * c.num_heads + 2 * c.num_kv_heads)
        layer += 3 * c.hidden_size * c.intermediate_size + 2 * c.hidden_size
        params = c.num_layers * layer + 2 * c.vocab_size * c.hidden_size + c.hidden_size
        return params * 4 / 1e6

    assert 1 < size_mb(PRESETS["tiny"]) < 10
    assert 80 < size_mb(PRESETS["100mb"]) < 130
    assert 400 < size_mb(PRESETS["500mb"]) < 600


def test_import_inspect_generate(tiny_hf: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    proc = run_surge("model", "import", str(tiny_hf), str(store), "--blocks", "2")
    assert proc.returncode == 0, proc.stderr
    assert "2 blocks" in proc.stdout and "import" in proc.stderr  # the progress bar
    proc = run_surge("model", "inspect", str(store), "--verify")
    assert proc.returncode == 0 and "all checksums ok" in proc.stdout

    proc = run_surge(
        "generate",
        str(store),
        "--prompt-token-ids",
        "0,5,9,200",
        "--max-tokens",
        "6",
        "--ignore-eos",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    (ref,) = LLMEngine.from_store(store).generate(
        [[0, 5, 9, 200]], SamplingParams(max_tokens=6, ignore_eos=True)
    )
    assert out["prompt_token_ids"] == [0, 5, 9, 200] and out["token_ids"] == ref.token_ids
    assert isinstance(out["text"], str)

    proc = run_surge("generate", str(store), "--prompt", "Hello world", "--max-tokens", "4")
    assert proc.returncode == 0 and proc.stdout.strip() != ""


def test_generate_without_a_store_makes_the_default_model(tmp_path: Path) -> None:
    env = {**os.environ, "SURGE_HOME": str(tmp_path / "home")}
    proc = run_surge("generate", "--prompt", "Hi", "--max-tokens", "3", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "home" / "models" / "surge-tiny" / "manifest.json").is_file()
    first = json.loads(proc.stdout)
    again = json.loads(
        run_surge("generate", "--prompt", "Hi", "--max-tokens", "3", "--json", env=env).stdout
    )
    assert again == first


# Each bad input is its own case (its own `surge` subprocess), so pytest-xdist spreads them
# over the workers. "{hf}" is the tiny HF checkpoint, "{store}" its imported block store,
# "{tmp}" a fresh directory.
BAD_INPUTS = [
    (("model", "import", "{tmp}/nope", "{tmp}/s"), ("not a directory",)),
    (("model", "import", "{tmp}/gpt2", "{tmp}/s"), ("not a Llama-family model",)),
    (("model", "import", "{hf}", "{tmp}/s", "--blocks", "0"), ("out of range", "1 <= blocks <= 4")),
    (("model", "import", "{hf}", "{tmp}/s", "--blocks", "9"), ("out of range", "1 <= blocks <= 4")),
    (("generate", "{tmp}/nope", "--prompt", "x"), ("not a directory",)),
    (("generate", "{hf}", "--prompt", "x"), ("surge model import",)),
    (
        ("generate", "{store}", "--prompt-token-ids", ",".join(["5"] * 2048)),
        ("2048 tokens", "shorten the prompt"),
    ),
    (("generate", "{store}", "--prompt-token-ids", "1,x"), ("comma-separated",)),
    (("generate", "{store}"), ("--prompt",)),
    (("generate", "{store}", "--prompt", "x", "--top-p", "0"), ("top_p",)),
    (("model", "create-tiny", "{tmp}/t", "--preset", "huge"), ("--preset",)),
]


@pytest.mark.parametrize(("args", "fragments"), BAD_INPUTS, ids=lambda v: " ".join(v)[:40])
def test_bad_inputs_exit_2_with_one_line(
    args: tuple[str, ...],
    fragments: tuple[str, ...],
    tiny_hf: Path,
    tiny_store: Path,
    tmp_path: Path,
) -> None:
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    paths = {"hf": str(tiny_hf), "store": str(tiny_store), "tmp": str(tmp_path)}
    assert_one_line_error(run_surge(*(a.format(**paths) for a in args)), *fragments)


def test_an_unknown_option_exits_2_naming_it() -> None:
    proc = run_surge("generate", "--bogus")
    assert proc.returncode == 2 and "No such option" in proc.stderr


def test_corrupted_store_is_refused_by_inspect(tiny_store: Path, tmp_path: Path) -> None:
    store = tmp_path / "s"
    shutil.copytree(tiny_store, store)
    block = store / "block-0001.bin"
    data = bytearray(block.read_bytes())
    data[100] ^= 0x40
    block.write_bytes(data)
    assert_one_line_error(
        run_surge("model", "inspect", str(store), "--verify"), "block 1", "checksum"
    )


def test_plan_command_is_mounted() -> None:
    proc = run_surge("plan", "--help")
    assert proc.returncode == 0 and "multicast" in proc.stdout


def test_store_missing_a_block_is_refused_by_inspect(tiny_store: Path, tmp_path: Path) -> None:
    store = tmp_path / "s"
    shutil.copytree(tiny_store, store)
    (store / "block-0002.bin").unlink()
    assert_one_line_error(
        run_surge("model", "inspect", str(store), "--verify"), "block 2", "missing"
    )


def test_every_flag_the_readme_shows_exists() -> None:
    """The README's command table (issue 14 #10): each `--flag` it shows for a command is
    one that command's --help lists, and it points at no file outside the repository."""
    import re

    from tests.conftest import REPO

    readme = (REPO / "README.md").read_text()
    assert "../shared/DESIGN.md" not in readme
    rows = re.findall(r"^\| `surge ((?:model |plan |node )?[a-z-]+)([^`]*)`", readme, re.M)
    assert len(rows) >= 8, rows
    for command, usage in rows:
        flags = set(re.findall(r"--[a-z][a-z-]*", usage))
        if not flags:
            continue
        proc = run_surge(*command.split(), "--help")
        assert proc.returncode == 0, (command, proc.stderr)
        missing = {f for f in flags if f not in proc.stdout}
        assert not missing, (command, missing)


def test_serve_chat_template_file_must_be_readable(tmp_path: Path) -> None:
    assert_one_line_error(
        run_surge("serve", "--chat-template", str(tmp_path / "nope.jinja"), "--port", "0"),
        "--chat-template",
        "cannot read",
    )
    (tmp_path / "empty.jinja").write_text("  \n")
    assert_one_line_error(
        run_surge("serve", "--chat-template", str(tmp_path / "empty.jinja"), "--port", "0"),
        "is empty",
    )
    # A template that does not compile: the server used to start, then answer every chat 400.
    (tmp_path / "broken.jinja").write_text("{% for m in messages %}{{ m.content }")
    state = tmp_path / "state"
    proc = run_surge("serve", "--chat-template", str(tmp_path / "broken.jinja"), "--port", "0",
                     "--nodes", "1", "--state-dir", str(state), timeout=60)  # fmt: skip
    assert_one_line_error(proc, "broken.jinja: the model's chat template does not compile")
    assert not state.exists(), "the server started"
