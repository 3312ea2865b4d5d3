"""surge's one-row projection kernel (`engine/gemv.py`): the same numbers as MKL's gemv on
every layout a projection has (stored `[in, out]`, a column slice of a fused q|k|v with
its parent's stride, sizes that are not multiples of the kernel's 8 rows and 8 lanes), and
a compiled decode step routes its one-row projections through it."""

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from surge.engine import compiled, gemv
from surge.engine.linear import Linear, fuse_linears, split_linear


@pytest.fixture(autouse=True)
def _kernel() -> Iterator[None]:
    """The kernel built, torch on one thread (unless a test sets more), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if not gemv.build():  # builds once per machine and source (~15 s), then loads
            pytest.skip("gemv_row needs AVX2, a C++ compiler and ninja")
        yield
    finally:
        torch.set_num_threads(before)
        gemv.load()


def _stored(out_features: int, in_features: int, seed: int) -> torch.Tensor:
    """An `[out, in]` weight read as a view of its stored `[in, out]` buffer."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(in_features, out_features, generator=g).t()


@pytest.mark.parametrize(("out_features", "in_features"), [(256, 256), (1000, 97), (13, 8), (5, 3)])
def test_gemv_row_matches_mkl(out_features: int, in_features: int) -> None:
    w = _stored(out_features, in_features, seed=out_features)
    x = torch.randn(1, in_features)
    assert gemv.usable(x, w)
    got = torch.ops.surge.gemv_row(x, w.t())
    ref = torch.nn.functional.linear(x, w)
    assert got.shape == ref.shape == (1, out_features)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_a_column_slice_of_a_fused_projection_keeps_its_stride() -> None:
    q, k, v = (Linear(_stored(n, 64, seed=n)) for n in (64, 32, 32))
    fused = fuse_linears([q, k, v])
    parts = split_linear(fused, [64, 32, 32])
    x = torch.randn(1, 64)
    for part, orig in zip(parts, (q, k, v), strict=True):
        wt = part.weight.t()
        assert wt.stride() == (128, 1)  # the parent's row, not the part's
        torch.testing.assert_close(torch.ops.surge.gemv_row(x, wt), x @ orig.weight.t())


@pytest.mark.parametrize("rows", range(2, gemv.KERNEL_MAX_ROWS + 1))
@pytest.mark.parametrize(("out_features", "in_features"), [(960, 576), (1000, 97), (13, 8)])
def test_a_small_batch_streams_the_weight_once_with_mkls_sums(
    rows: int, out_features: int, in_features: int
) -> None:
    """Up to `KERNEL_MAX_ROWS` input rows (a decode batch) in one call, every row MKL's
    numbers, at one thread and at two (the threaded row blocks)."""
    w = _stored(out_features, in_features, seed=rows)
    x = torch.randn(rows, 1, in_features)  # [batch, 1 token, hidden], as a decode step has
    assert gemv.usable(x, w) == (rows <= gemv.max_rows())  # the engine's rule
    ref = torch.nn.functional.linear(x, w)
    got = torch.ops.surge.gemv_row(x, w.t())
    assert got.shape == ref.shape == (rows, 1, out_features)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-4)
    torch.set_num_threads(2)
    assert torch.equal(torch.ops.surge.gemv_row(x, w.t()), got)


def test_only_a_few_float32_rows_of_a_stored_weight_are_usable() -> None:
    w = _stored(16, 8, seed=0)
    assert gemv.usable(torch.randn(1, 8), w)
    assert gemv.usable(torch.randn(gemv.max_rows(), 8), w)
    assert not gemv.usable(torch.randn(gemv.max_rows() + 1, 8), w)  # more rows: packed/MKL
    assert not gemv.usable(torch.randn(1, 8), w.contiguous())  # not the stored layout
    assert not gemv.usable(torch.randn(1, 8, dtype=torch.float64), w.double())


def test_at_one_thread_eight_rows_go_to_onednn() -> None:
    """The rule is read by `load()` from torch's thread count (a runner calls it as it
    starts): at one thread oneDNN's packed GEMM takes batches of 8 (faster there), at two
    the kernel keeps them."""
    w = _stored(16, 8, seed=0)
    eight = torch.randn(8, 1, 8)
    gemv.load()  # the fixture's one thread
    assert gemv.max_rows() == gemv.MAX_ROWS_ONE_THREAD == 7
    assert gemv.usable(torch.randn(7, 1, 8), w) and not gemv.usable(eight, w)
    assert compiled.batch_class(8) == compiled.batch_class(9) != compiled.batch_class(7)
    torch.set_num_threads(2)
    gemv.load()
    assert gemv.max_rows() == gemv.MAX_ROWS == 8
    assert gemv.usable(eight, w)
    assert compiled.batch_class(8) == compiled.batch_class(2) != compiled.batch_class(9)


@pytest.mark.parametrize(
    ("out_features", "in_features"), [(3000, 600), (960, 576), (576, 1536), (20000, 576)]
)
def test_every_thread_count_uses_the_kernel_with_the_same_sums(
    out_features: int, in_features: int
) -> None:
    """The kernel splits the weight's rows over torch's threads in fixed blocks, so each
    column's sum is the same whatever the thread count, and the engine calls it at every
    thread count (2 is torch's default here)."""
    before = torch.get_num_threads()
    w = _stored(out_features, in_features, seed=1)  # above the one-thread floor
    x = torch.randn(1, in_features)
    try:
        torch.set_num_threads(1)
        one = torch.ops.surge.gemv_row(x, w.t())
        for threads in (2, 3, 4):
            torch.set_num_threads(threads)
            assert gemv.usable(x, w)
            assert torch.equal(torch.ops.surge.gemv_row(x, w.t()), one)
        torch.testing.assert_close(one, torch.nn.functional.linear(x, w), rtol=1e-5, atol=1e-4)
    finally:
        torch.set_num_threads(before)
        gemv.load()


def test_a_column_slice_keeps_its_stride_in_the_row_blocks() -> None:
    """A part of a fused projection large enough for the threaded row blocks."""
    q, k, v = (Linear(_stored(n, 576, seed=n)) for n in (576, 192, 192))
    parts = split_linear(fuse_linears([q, k, v]), [576, 192, 192])
    x = torch.randn(1, 576)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        for part, orig in zip(parts, (q, k, v), strict=True):
            got = torch.ops.surge.gemv_row(x, part.weight.t())
            torch.testing.assert_close(got, x @ orig.weight.t(), rtol=1e-5, atol=1e-4)
    finally:
        torch.set_num_threads(before)


def test_the_kernel_runs_on_torchs_openmp_threads() -> None:
    """The library is built with OpenMP and shares torch's runtime: built without it,
    `at::parallel_for` ran every block on the calling thread (the kernel read at one
    thread's speed whatever torch's thread count), and a second OpenMP runtime would start a
    second team of threads on the same cores."""
    library = gemv.library_path().read_bytes()
    assert b"GOMP_parallel" in library and b"libgomp.so.1" in library  # calls, links OpenMP
    gomp = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()}
    assert len({p for p in gomp if "libgomp" in Path(p).name}) == 1


def test_a_compiled_one_row_projection_calls_the_kernel() -> None:
    """Fails if the compiled path quietly keeps MKL's gemv, or breaks the graph to choose
    (asking torch for its thread count inside the graph did, at every projection)."""
    lin = Linear(_stored(48, 32, seed=1), torch.randn(48))
    x = torch.randn(1, 32)
    called: list = []

    def backend(gm: torch.fx.GraphModule, inputs):  # records the graph's ops, runs it as is
        called.extend(n.target for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    assert compiled.wait_for_compiles(timeout_s=600)  # other tests' engines' compiles
    torch._dynamo.reset()
    torch.set_num_threads(2)
    try:
        got = torch.compile(lin.__call__, backend=backend, fullgraph=True)(x)
    finally:
        torch._dynamo.reset()
    assert torch.ops.surge.gemv_row.default in called or torch.ops.surge.gemv_row in called
    assert torch.nn.functional.linear not in called
    torch.testing.assert_close(got, torch.nn.functional.linear(x, lin.weight, lin.bias))


def test_an_eager_projection_of_a_few_rows_calls_the_kernel(monkeypatch) -> None:
    lin = Linear(_stored(48, 32, seed=2))
    calls = []
    real = torch.ops.surge.gemv_row

    class Spy:  # stands in for torch.ops.surge.gemv_row, counting its calls
        def __call__(self, x, wt):
            calls.append(tuple(wt.shape))
            return real(x, wt)

    monkeypatch.setattr(torch.ops.surge, "gemv_row", Spy())
    lin(torch.randn(1, 32))
    lin(torch.randn(3, 32))  # a small batch: the kernel too
    lin(torch.randn(gemv.max_rows() + 1, 32))  # more rows: MKL
    assert calls == [(32, 48), (32, 48)]


def test_load_never_compiles_and_reports_the_kernel_missing(tmp_path: Path) -> None:
    """An agent or engine starting where the kernel is not built keeps MKL at once: `load()`
    neither compiles nor waits on a build (a killed build once left a lock every later
    agent waited on forever, so no agent started)."""
    code = (
        "import time; t = time.perf_counter(); from surge.engine import gemv; ok = gemv.load(); "
        "print(ok, gemv.library_path().exists(), gemv.build_dir().exists())"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "empty-cache")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "False"]


def test_build_clears_a_dead_builds_lock_and_builds_from_its_own_copy(
    tmp_path: Path, monkeypatch
) -> None:
    """A lock older than `STALE_LOCK_S` is removed before building; the source compiled is a
    copy inside the build directory, so the build's command line is the same from every
    checkout (ninja does not rebuild when the checkout moves)."""
    import torch.utils.cpp_extension as cpp

    where = tmp_path / "kernels" / gemv.build_name()
    monkeypatch.setattr(gemv, "build_dir", lambda: where)
    where.mkdir(parents=True)
    lock = where / "lock"
    lock.touch()
    old = time.time() - gemv.STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    seen: dict = {}

    def fake_load(**kwargs):  # records the call instead of compiling for 15 s
        seen.update(kwargs, lock_left=lock.exists())
        raise RuntimeError("not compiled in this test")

    monkeypatch.setattr(cpp, "load", fake_load)
    assert gemv.build() is False  # the fake build failed: MKL stays
    assert seen["lock_left"] is False
    assert seen["build_directory"] == str(where)
    assert seen["sources"] == [str(where / src.name) for src in gemv.SOURCES]
    for src in gemv.SOURCES:
        assert (where / src.name).read_bytes() == src.read_bytes()


def test_the_build_is_named_by_its_source_not_its_checkout(tmp_path: Path, monkeypatch) -> None:
    name = gemv.build_name()
    copies = tuple(tmp_path / "elsewhere" / src.name for src in gemv.SOURCES)
    copies[0].parent.mkdir()
    for src, copy in zip(gemv.SOURCES, copies, strict=True):
        copy.write_bytes(src.read_bytes())
    monkeypatch.setattr(gemv, "SOURCES", copies)
    copy = copies[-1]
    assert gemv.build_name() == name
    copy.write_bytes(copy.read_bytes() + b"\n// changed\n")
    assert gemv.build_name() != name
