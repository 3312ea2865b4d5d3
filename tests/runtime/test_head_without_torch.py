"""A pipeline's head engines serve a greedy request while the controller's torch import has
not finished (`runtime/torch_import.py`, `engine/sampling.py` `needs_torch`): a restarted
controller's adopted pipeline (`control/adoption.py`) and a fresh one's first scale-out answer
it without waiting seconds for torch; a sampled request waits for the import, then is served.

In a fresh interpreter, `import torch` is held (its module runs once the probe lets it go):
the head engine, made as a scale-out or an adoption makes it, over fake stages whose
logits pick the last token + 1, answers the greedy request in full with torch still not
imported, the sampled one not at all; once the import is let go, the sampled one is served.
Before, the head engine's module imported torch itself (the held import never returned)."""

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.runtime.conftest import MODEL

PROBE = """
import asyncio, importlib.machinery, json, sys, threading, types

gate = threading.Event()


class HeldLoader:
    # torch's module runs once the probe lets it go: until then its import is "running"
    # (seconds, as on a loaded machine), under torch's module lock only, as a real one
    def __init__(self, real):
        self.real = real

    def create_module(self, spec):
        return self.real.create_module(spec)

    def exec_module(self, module):
        gate.wait(120)
        self.real.exec_module(module)


class HoldTorch:
    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        spec.loader = HeldLoader(spec.loader)
        return spec


def torch_imported():
    # imported in full (during its import, its module is in sys.modules already)
    return hasattr(sys.modules.get("torch"), "from_numpy")


sys.meta_path.insert(0, HoldTorch())

import numpy as np

from surge.engine.sampling import SamplingParams
from surge.model.manifest import read_manifest
from surge.runtime.pipeline_endpoint import PipelineEndpoint
from surge.runtime.protocol import StageStepOp
from surge.runtime.request import ServeRequest

manifest = read_manifest(sys.argv[1])
vocab = manifest.arch.vocab_size
out = {"torch after imports": "torch" in sys.modules}


class Stages:
    # The pipeline's stages: the logits of each row's last token pick that token + 1
    async def call_bytes(self, node, op, payload=None):
        if not isinstance(op, StageStepOp):
            return None, b""
        logits = np.zeros((len(op.batch.seq_ids), vocab), dtype=np.float32)
        for b, q in enumerate(op.batch.q_lens):
            logits[b, (int(payload[b, q - 1]) + 1) % vocab] = 1.0
        return types.SimpleNamespace(shape=logits.shape), logits.tobytes()


async def main():
    ep = PipelineEndpoint(Stages(), manifest, "m", "m-pipe", [(0, 0, 1), (1, 1, 2)])
    ep.set_micro_batches(ep.num_micro_batches)  # head engines; the stages are open
    greedy = ServeRequest("g", [5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True))
    sampled = SamplingParams(max_tokens=3, temperature=1.0, seed=1, ignore_eos=True)
    other = ServeRequest("s", [5, 6, 7], sampled)
    await ep.submit(other)
    await ep.submit(greedy)
    await asyncio.wait_for(greedy.done.wait(), 60)
    await asyncio.sleep(0.3)  # time for the sampled one to be wrongly served
    out["greedy tokens"] = greedy.output_token_ids
    out["torch while greedy served"] = torch_imported()
    out["sampled tokens before torch"] = list(other.output_token_ids)
    gate.set()
    await asyncio.wait_for(other.done.wait(), 300)
    out["sampled tokens after torch"] = len(other.output_token_ids)
    out["torch at the end"] = torch_imported()
    for g in ep.groups:
        g.task.cancel()


asyncio.run(main())
print(json.dumps(out))
"""


def test_a_pipeline_head_serves_greedy_requests_before_torch_is_imported(registry: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(registry / MODEL)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["torch after imports"] is False, "the head engine's modules import torch"
    assert out["greedy tokens"] == [8, 9, 10, 11]
    assert out["torch while greedy served"] is False
    assert out["sampled tokens before torch"] == [], "a sampled request ran without torch"
    assert out["sampled tokens after torch"] == 3
    assert out["torch at the end"] is True
