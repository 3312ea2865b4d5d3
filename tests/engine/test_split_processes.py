"""Splitting the layers over two or three runners in separate processes, passing serialized
hidden states between them, gives the same tokens as one runner."""

import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from surge.engine.batch import BatchMeta
from surge.engine.llm_engine import LLMEngine
from surge.engine.sampling import Draw, Sampled, SamplingParams, sample
from surge.model.manifest import read_manifest
from surge.wire import encode_frame, read_frame

REPO = Path(__file__).resolve().parents[2]


class ProcessPipelineExecutor:
    """Drives stage processes in order: tokens -> stage 0 -> ... -> logits, sampled here."""

    def __init__(self, store: Path, cuts: list[int]) -> None:
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.engine.stage_worker", str(store), str(a), str(b)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                cwd=REPO,
            )
            for a, b in itertools.pairwise(cuts)
        ]
        self.bytes_between_stages = 0

    def _call(
        self, proc: subprocess.Popen, header: dict, payload: bytes = b""
    ) -> tuple[dict, bytearray]:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(encode_frame(header, payload))
        proc.stdin.flush()
        frame = read_frame(proc.stdout)
        assert frame is not None, f"stage process exited with {proc.wait(5)}"
        return frame

    def step(
        self, token_ids: np.ndarray, batch: BatchMeta, draws: tuple[Draw | None, ...]
    ) -> Sampled:
        header, payload = self._call(
            self.procs[0],
            {"op": "tokens", "shape": list(token_ids.shape), "batch": batch.to_json()},
            np.ascontiguousarray(token_ids),
        )
        for proc in self.procs[1:]:
            assert header["op"] == "hidden"
            self.bytes_between_stages += len(payload)
            header, payload = self._call(proc, {"op": "hidden"}, payload)
        assert header["op"] == "logits"
        logits = torch.frombuffer(payload, dtype=torch.float32).view(header["shape"])
        return sample(logits, draws, batch)

    def free(self, seq_ids: list[int]) -> None:
        for proc in self.procs:
            self._call(proc, {"op": "free", "seq_ids": seq_ids})

    def close(self) -> None:
        for proc in self.procs:
            if proc.stdin:
                proc.stdin.close()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


PROMPTS = [[0, 5, 9, 200, 31, 17, 4], [0, 8], [0, 3, 44, 55, 66, 77, 88, 99, 100, 101]]


@pytest.mark.parametrize(
    "cuts",
    [[0, 2, 4], [0, 1, 3, 4], [0, 3, 4]],
    ids=["2-stages-inside-block", "3-stages", "2-stages-on-block-edge"],
)
def test_split_over_processes_matches_one_runner(tiny_store: Path, cuts: list[int]) -> None:
    manifest = read_manifest(tiny_store)
    params = [
        SamplingParams(max_tokens=12, ignore_eos=True),
        SamplingParams(max_tokens=7, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=11, ignore_eos=True),
    ]
    expected = LLMEngine(manifest).generate(PROMPTS, params)
    executor = ProcessPipelineExecutor(tiny_store, cuts)
    try:
        got = LLMEngine(manifest, executor=executor).generate(PROMPTS, params)
    finally:
        executor.close()
    assert [g.token_ids for g in got] == [e.token_ids for e in expected]
    assert executor.bytes_between_stages > 0
    assert all(p.returncode == 0 for p in executor.procs)
