"""Two agents of one host group sharing one device copy (`open_mate_copy`).

What flows: the store's registry in; two agents started on this machine as one host group;
node 0 loads the model from the registry into its gpu tier, node 1 opens node 0's copy
through IPC handles. Out: the seconds of each, the device memory node 1's open took (about
none where the copy is shared), and whether both generate the same tokens.
"""

import asyncio
import time
from pathlib import Path

import torch

from surge.engine.sampling import SamplingParams
from surge.runtime.launch.local import LocalCluster, LocalClusterConfig
from surge.runtime.protocol import GenerateOp, LoadOp, OpenMateCopyOp, RegisterOp


def device_used_bytes(device: str) -> int | None:
    """Bytes in use on the whole device (every process), where CUDA can say."""
    if not device.startswith("cuda"):
        return None
    free, total = torch.cuda.mem_get_info(torch.device(device))
    return total - free


def shared_copy(registry: Path, model: str, device: str, prompt: list[int], tokens: int) -> dict:
    """Run the two agents; `device` is theirs (`fake` stands in for a GPU on the CPU)."""
    config = LocalClusterConfig(
        num_nodes=2, host_groups=((0, 1),), remote_dir=registry, device=device, max_kv_tokens=2048
    )
    cluster = LocalCluster(config)
    cluster.start()
    try:
        return asyncio.run(_run(cluster, model, device, prompt, tokens))
    finally:
        cluster.stop()


async def _run(cluster: LocalCluster, model: str, device: str, prompt: list[int], n: int) -> dict:
    client = cluster.client()
    await client.connect()
    try:
        await cluster.wire_peers(client)
        reply = await client.call(0, RegisterOp(model=model))
        await client.call(1, RegisterOp(model=model))
        blocks = tuple(range(reply.num_blocks))
        t0 = time.perf_counter()
        await client.call(0, LoadOp(model=model, blocks=blocks, source="remote", tier="gpu"))
        load_s = time.perf_counter() - t0
        before = device_used_bytes(device)
        t0 = time.perf_counter()
        await client.call(1, OpenMateCopyOp(model=model, blocks=blocks, mate=0))
        open_s = time.perf_counter() - t0
        after = device_used_bytes(device)
        params = SamplingParams(max_tokens=n, ignore_eos=True)
        ask = GenerateOp(model=model, prompt_token_ids=tuple(prompt), params=params)
        outs = [list((await client.call(node, ask)).token_ids) for node in (0, 1)]
        return {
            "agents_device": device,
            "owner_load_from_registry_s": load_s,
            "mate_open_s": open_s,
            "mate_open_device_bytes": None if before is None else after - before,
            "same_tokens": outs[0] == outs[1],
            "token_ids": outs[1],
        }
    finally:
        await client.close()
