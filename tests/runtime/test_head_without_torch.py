"""A pipeline's head engines serve every request without torch: greedy, sampled (the API's
default temperature is 1) and asking for logprobs. The last stage picks the tokens
(`StageStepOp.draws` -> `StageStepReply.sampled`), so the controller — a restarted one
adopting a pipeline (`control/adoption.py`), or one opening its first scale-out — never
imports torch.

In a fresh interpreter where `import torch` fails, the head engine, made as a scale-out or
an adoption makes it, over fake stages that pick each row's last token + 1, answers all
three requests in full; each step carried each row's draw (the sampled request's own seed,
the logprobs count). Before, a sampled or logprobs request waited in the head engine's
queue for a background import of torch (seconds; 0.52x a reload's time to a first token
on an adopted SmolLM2 pipeline)."""

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.runtime.conftest import MODEL

PROBE = """
import asyncio, json, sys, types


class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is not importable in this probe")
        return None


sys.meta_path.insert(0, NoTorch())

from surge.engine.sampling import Sampled, SamplingParams, TokenLogprobs
from surge.model.manifest import read_manifest
from surge.runtime.pipeline_endpoint import PipelineEndpoint
from surge.runtime.protocol import StageStepOp
from surge.runtime.request import ServeRequest

manifest = read_manifest(sys.argv[1])
vocab = manifest.arch.vocab_size
draws = []


class Stages:
    # The pipeline's stages: each row with a draw picks its last token + 1
    async def call_bytes(self, node, op, payload=None):
        if not isinstance(op, StageStepOp):
            return None, b""
        json.dumps(op.to_json())  # plain JSON on the wire
        tokens, logprobs = [], []
        for b, (q, d) in enumerate(zip(op.batch.q_lens, op.draws)):
            if d is None:
                continue
            draws.append(d.to_json())
            tokens.append((int(payload[b, q - 1]) + 1) % vocab)
            lp = TokenLogprobs(-0.5, ((tokens[-1], -0.5),))
            logprobs.append(None if d.logprobs is None else lp)
        if all(lp is None for lp in logprobs):
            logprobs = []
        return types.SimpleNamespace(sampled=Sampled(tuple(tokens), tuple(logprobs))), b""


async def main():
    ep = PipelineEndpoint(Stages(), manifest, "m", "m-pipe", [(0, 0, 1), (1, 1, 2)])
    ep.set_micro_batches(ep.num_micro_batches)  # head engines; the stages are open
    reqs = {
        "greedy": SamplingParams(max_tokens=4, ignore_eos=True),
        "sampled": SamplingParams(max_tokens=3, temperature=1.0, seed=11, ignore_eos=True),
        "logprobs": SamplingParams(max_tokens=2, logprobs=1, ignore_eos=True),
    }
    reqs = {k: ServeRequest(k, [5, 6, 7], p) for k, p in reqs.items()}
    for r in reqs.values():
        await ep.submit(r)
    await asyncio.wait_for(asyncio.gather(*(r.done.wait() for r in reqs.values())), 60)
    out = {k: r.output_token_ids for k, r in reqs.items()}
    out["logprobs given"] = len(reqs["logprobs"].logprobs)
    out["draws"] = draws
    out["torch"] = "torch" in sys.modules
    for g in ep.groups:
        g.task.cancel()
    print(json.dumps(out))


asyncio.run(main())
"""


def test_a_pipeline_head_serves_sampled_and_logprobs_requests_without_torch(
    registry: Path,
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(registry / MODEL)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["torch"] is False
    assert out["greedy"] == [8, 9, 10, 11]
    assert out["sampled"] == [8, 9, 10]
    assert out["logprobs"] == [8, 9]
    assert out["logprobs given"] == 2
    assert {"temperature": 1.0, "seed": 11} in out["draws"]
    assert {"logprobs": 1} in out["draws"] and {} in out["draws"]
