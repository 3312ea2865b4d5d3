"""The engine's CUDA path, tested on the CPU (no GPU here; docs/gpu.md says what never ran
on one): what is picked by device (dtype, decode path, the CPU-only attention kernel);
bfloat16 against float32 tokens on the CPU within a stated tolerance; CUDA-graph decode
(buckets, padding, static inputs) replayed by re-running the captured step, token-exact
against the eager engine; and the calls `TorchCudaGraphs` makes, against a recording
stand-in for `torch.cuda`."""

import contextlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from surge.config import EngineConfig
from surge.engine.batch import BatchMeta
from surge.engine.cuda_graphs import WARMUP_STEPS, CudaGraphDecode, RerunGraphs, TorchCudaGraphs
from surge.engine.device import compute_dtype, decode_path
from surge.engine.kv_cache import PagedKVCache
from surge.engine.llm_engine import LLMEngine, LocalExecutor
from surge.engine.model import RopeTable
from surge.engine.runner import ModelRunner
from surge.engine.sampling import SamplingParams
from surge.errors import SurgeError
from surge.model.arch import RopeConfig
from surge.model.manifest import read_manifest
from tests.engine.reference import hf_greedy

CUDA, CPU = torch.device("cuda"), torch.device("cpu")
PROMPTS = [[0, 5, 9, 200, 31], [0, 8], [0, 3, 44, 55, 66, 77, 88, 99], list(range(1, 40))]

BF16_RELATIVE_TIE = 1 / 64
"""bfloat16 keeps 8 significant bits (2^-8 relative per rounding); over a tiny model's
layers the logits move by up to ~1% of their scale (measured on this model: tokens part at
fp32 top-2 gaps of 0.0035 and 0.024 with logits up to 3.3). A bf16 token may differ from
fp32's only where fp32's top two logits are within 1/64 of the largest |logit|, and the bf16
token is one of those two; the sequences are compared no further (they have diverged)."""


def test_dtype_and_decode_path_are_picked_by_device() -> None:
    assert compute_dtype("auto", CUDA, torch.float32) == torch.bfloat16
    assert compute_dtype("auto", CUDA, torch.bfloat16) == torch.bfloat16
    assert compute_dtype("auto", CUDA, torch.float16) == torch.float16
    assert compute_dtype("auto", CPU, torch.float32) == torch.float32
    assert compute_dtype("auto", CPU, torch.bfloat16) == torch.bfloat16
    assert compute_dtype("bfloat16", CPU, torch.float32) == torch.bfloat16
    assert decode_path(CUDA, cuda_graphs=True, compile_decode=True) == "cuda_graphs"
    assert decode_path(CUDA, cuda_graphs=False, compile_decode=True) == "eager"
    assert decode_path(CPU, cuda_graphs=True, compile_decode=True) == "compiled"
    assert decode_path(CPU, cuda_graphs=True, compile_decode=False) == "eager"
    with pytest.raises(SurgeError, match="engine dtype 'int8' is not auto"):
        EngineConfig(dtype="int8").validate()


def test_the_cpu_flash_kernel_is_never_picked_off_the_cpu() -> None:
    """A prompt piece after cached tokens takes the two-part path (ATen's CPU flash kernel)
    on the CPU only; the same step on another device (meta stands in for CUDA) is masked
    SDPA over gathered pages."""
    piece = BatchMeta(seq_ids=(0,), q_lens=(4,), ctx_lens=(8,))
    for device, two_part in ((CPU, True), (torch.device("meta"), False)):
        kv = PagedKVCache(2, 8, 4, 2, 16, torch.float32, device)
        kv.ensure(0, 8)
        ctx = kv.prepare(piece, RopeTable(RopeConfig(), 16, CPU, torch.float32))
        assert (ctx.prior_len > 0) is two_part and (ctx.mask is None) is two_part, device


def _tokens(store: Path, config: EngineConfig, graphs: bool = False, lengths=(24,) * 4):
    manifest = read_manifest(store)
    runner = ModelRunner(manifest, config)
    runner.load_blocks()
    if graphs:
        runner.cuda_graphs = CudaGraphDecode(
            runner.decode_logits,
            runner.kv.scratch_page,
            config.page_size_tokens,
            runner.device,
            RerunGraphs(),
            max_batch=4,
        )
    engine = LLMEngine(manifest, config, LocalExecutor(runner))
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
    return [c.token_ids for c in engine.generate(PROMPTS, params)], runner


def test_bf16_tokens_agree_with_fp32_within_the_stated_tolerance(tiny_hf, tiny_store) -> None:
    fp32, runner = _tokens(tiny_store, EngineConfig(max_kv_tokens=1024))
    bf16, low = _tokens(tiny_store, EngineConfig(max_kv_tokens=1024, dtype="bfloat16"))
    assert runner.dtype == torch.float32 and low.dtype == torch.bfloat16
    assert low.kv.k.dtype == torch.bfloat16 and low.weights.layers[0].o.weight.dtype == low.dtype
    agreed = 0
    for prompt, ours, exact in zip(PROMPTS, bf16, fp32, strict=True):
        ref, logits = hf_greedy(tiny_hf, prompt, len(exact))
        assert exact == ref  # the float32 engine is the reference's
        for step, (a, b) in enumerate(zip(ours, exact, strict=True)):
            if a != b:
                top = torch.topk(logits[step], 2)
                gap = float(top.values[0] - top.values[1])
                scale = float(logits[step].abs().max())
                assert gap < BF16_RELATIVE_TIE * scale and a in top.indices.tolist(), (
                    f"bf16 token {step} of {prompt[:3]} is {a}, fp32 {b}: gap {gap:.3g} at "
                    f"logit scale {scale:.3g} is no near-tie"
                )
                break
            agreed += 1
    assert agreed >= len(PROMPTS) * 24 // 2  # mostly the same tokens, not a broken model


def test_graph_decode_gives_the_eager_tokens(tiny_store) -> None:
    """Buckets of batch 1, 2 and 4: four sequences of different lengths decode as 4, 3, 2,
    1 rows (3 in the bucket of 4: a padded row), and the pages gathered grow across
    power-of-two buckets (padded pages): every token is the eager one's."""
    config = EngineConfig(max_kv_tokens=1024, page_size_tokens=4)
    lengths = (6, 14, 22, 30)
    eager, _ = _tokens(tiny_store, config, lengths=lengths)
    graphed, runner = _tokens(tiny_store, config, graphs=True, lengths=lengths)
    assert graphed == eager
    graphs = runner.cuda_graphs
    assert graphs is not None and graphs.replays > 0
    assert {b for b, _ in graphs.buckets} == {1, 2, 4}
    assert len({p for _, p in graphs.buckets}) >= 2, sorted(graphs.buckets)
    assert graphs.capture.captures == len(graphs.buckets)  # once per bucket, then replayed
    assert graphs.bucket_of(5, 2) is None and graphs.bucket_of(3, 5) == (4, 8)  # 5: eager


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.current = "engine"


class FakeStream:
    def __init__(self, rec: Recorder, name: str) -> None:
        self.rec, self.name = rec, name

    def wait_stream(self, other: "FakeStream") -> None:
        self.rec.calls.append(("wait_stream", self.name, other.name))


class FakeGraph:
    def __init__(self, rec: Recorder) -> None:
        self.rec = rec

    def replay(self) -> None:
        self.rec.calls.append(("replay",))


def fake_cuda(rec: Recorder) -> SimpleNamespace:
    @contextlib.contextmanager
    def on_stream(stream):
        before, rec.current = rec.current, stream.name
        yield
        rec.current = before

    @contextlib.contextmanager
    def graph(g, pool=None):
        rec.calls.append(("capture_begin", pool))
        before, rec.current = rec.current, "capture"
        yield
        rec.current = before
        rec.calls.append(("capture_end",))

    return SimpleNamespace(
        Stream=lambda: FakeStream(rec, "side"),
        current_stream=lambda: FakeStream(rec, rec.current),
        stream=on_stream,
        graph=graph,
        CUDAGraph=lambda: FakeGraph(rec),
        graph_pool_handle=lambda: rec.calls.append(("pool",)) or "pool-1",
    )


def test_torch_cuda_graphs_warm_up_aside_then_capture_into_one_pool() -> None:
    rec = Recorder()
    body = TorchCudaGraphs(fake_cuda(rec))
    out = torch.zeros(2)

    def step() -> torch.Tensor:
        rec.calls.append(("step", rec.current))
        return out

    first = body.capture(step)
    assert rec.calls == [
        ("wait_stream", "side", "engine"),  # the side stream starts after the engine's work
        *[("step", "side")] * WARMUP_STEPS,
        ("wait_stream", "engine", "side"),  # and the engine waits for the warm-up
        ("pool",),
        ("capture_begin", "pool-1"),
        ("step", "capture"),
        ("capture_end",),
    ]
    assert first.out is out
    rec.calls.clear()
    body.capture(step)
    assert ("pool",) not in rec.calls and ("capture_begin", "pool-1") in rec.calls
    first.replay()
    assert rec.calls[-1] == ("replay",)
