"""A stage in its own process for tests: runs layers [FIRST, END) of a store, frames over
stdin/stdout (JSON header + raw bytes, never pickle).

Requests: {"op": "tokens"} + int64 token ids [B, Q], or {"op": "hidden"} + a hidden-states
frame; both carry the batch. Reply: hidden states for the next stage, or float32 logits when
this stage holds the model's last layer. {"op": "free", "seq_ids": [...]} drops caches.
Usage: python -m tests.engine.stage_worker STORE FIRST END
"""

import sys
from pathlib import Path

import torch

from surge.engine.batch import BatchMeta
from surge.engine.hidden import hidden_from_bytes, hidden_to_bytes
from surge.engine.runner import ModelRunner
from surge.model.manifest import read_manifest
from surge.wire import encode_frame, read_frame


def main() -> None:
    store, first, end = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    manifest = read_manifest(store)
    runner = ModelRunner(manifest, layer_range=(first, end))
    runner.load_blocks()
    is_last = end == manifest.arch.num_layers
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while (frame := read_frame(stdin)) is not None:
        header, payload = frame
        op = header["op"]
        if op == "free":
            for sid in header["seq_ids"]:
                runner.free(sid)
            stdout.write(encode_frame({"op": "freed"}))
        else:
            if op == "tokens":
                batch = BatchMeta.from_json(header["batch"])
                tokens = torch.frombuffer(payload, dtype=torch.int64).view(header["shape"])
                hidden = runner.embed(tokens)
            else:
                hidden, batch, _ = hidden_from_bytes(payload)
            hidden = runner.run_layers(first, end, hidden, batch)
            if is_last:
                logits = runner.logits(hidden, batch).contiguous()
                stdout.write(
                    encode_frame({"op": "logits", "shape": list(logits.shape)}, logits.numpy())
                )
            else:
                stdout.write(encode_frame({"op": "hidden"}, hidden_to_bytes(hidden, batch)))
        stdout.flush()


if __name__ == "__main__":
    main()
