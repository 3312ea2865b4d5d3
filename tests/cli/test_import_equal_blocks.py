"""`surge model import --equal-blocks`: the equal-block store the emulation benchmarks import
(every block padded to the largest), made from the command line for `surge serve --emulate`;
one `error:` line where there is nothing to pad; and `surge serve --emulate --cluster netns`
warns of a store of unequal blocks, naming the flag."""

import logging
from pathlib import Path

from surge.cli.serve_emulation import emulated_store
from surge.emulation import EmulationConfig
from surge.model.manifest import read_manifest
from tests.cli.test_cli import assert_one_line_error
from tests.conftest import run_surge

EMULATE = EmulationConfig.parse("lambdascale-testbed1:llama2-13b", 1.0)


def _import(tiny_hf: Path, store: Path, *flags: str):
    return run_surge("model", "import", str(tiny_hf), str(store), "--quiet", *flags)


def test_equal_blocks_from_the_command_line(tiny_hf: Path, tmp_path: Path) -> None:
    plain = _import(tiny_hf, tmp_path / "p", "--blocks", "3")
    equal = _import(tiny_hf, tmp_path / "e", "--blocks", "3", "--equal-blocks")
    assert plain.returncode == 0 and equal.returncode == 0, equal.stderr
    sizes = [b.size_bytes for b in read_manifest(tmp_path / "p").blocks]
    assert len(set(sizes)) > 1, "the tiny model's end blocks hold the embeddings and head"
    got = [b.size_bytes for b in read_manifest(tmp_path / "e").blocks]
    assert got == [max(sizes)] * 3
    assert f"(equal: {max(sizes) / 1e6:.2f} MB each)" in equal.stdout
    assert "(equal:" not in plain.stdout
    check = run_surge("model", "inspect", str(tmp_path / "e"), "--verify")
    assert check.returncode == 0 and "all checksums ok" in check.stdout, check.stderr


def test_equal_blocks_of_a_single_block_is_one_error_line(tiny_hf: Path, tmp_path: Path) -> None:
    proc = _import(tiny_hf, tmp_path / "s", "--blocks", "1", "--equal-blocks")
    assert_one_line_error(proc, "--equal-blocks", "--blocks 2 or more")
    assert not (tmp_path / "s").exists()  # refused before anything was written


def test_serving_an_unequal_store_on_netns_warns_with_the_fix(
    tiny_hf: Path, tmp_path: Path, caplog
) -> None:
    assert _import(tiny_hf, tmp_path / "p", "--blocks", "3").returncode == 0
    assert _import(tiny_hf, tmp_path / "e", "--blocks", "3", "--equal-blocks").returncode == 0
    caplog.set_level(logging.WARNING, logger="surge.cli.serve_emulation")
    for store, cluster in (("p", "loopback"), ("e", "netns"), ("p", "netns")):
        emulated_store(EMULATE, [{"model": str(tmp_path / store)}], 2, cluster)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1, warned  # only the unequal store, only on netns
    assert str(tmp_path / "p") in warned[0] and "--equal-blocks" in warned[0]
