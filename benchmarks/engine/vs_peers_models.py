"""The models benchmarks/engine/vs_peers.py compares engines on: one HF checkpoint directory
(what transformers and vLLM load) and the surge store imported from it, per model.

What flows: a spec (a preset name of `surge.model.tiny_shape`: random weights; `smollm2`: the
real model's GGUF that setup fetches; or a path to an HF directory or a .gguf file) in, a
dict out: name, hf_dir, store, vocab, max_len (longest sequence the engines are set up
for), real (a trained model: long-prompt shapes run on it). A GGUF is dequantized once by
transformers (float32) and saved as an HF directory, so all engines read the same weights.
"""

import json
from pathlib import Path


def prepare_model(spec: str, where: Path) -> dict:
    from surge.model.importer import import_checkpoint
    from surge.model.tiny import create_tiny_model
    from surge.model.tiny_shape import PRESETS, preset

    hf_dir, store = where / "hf", where / "store"
    real = True
    if spec in PRESETS:
        create_tiny_model(hf_dir, preset(spec, dtype="float32"))
        real, source = False, f"preset {spec} (random weights)"
    else:
        path = Path(spec)
        if spec == "smollm2":
            from surge.model.default_store import real_model_gguf

            path = real_model_gguf()
        if not path.exists():
            raise SystemExit(f"error: {path} does not exist; run ./setup.sh (it fetches SmolLM2)")
        source = str(path)
        if path.suffix == ".gguf":
            import torch
            from safetensors.torch import save_file
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, dtype=torch.float32
            )
            # transformers refuses save_pretrained for a GGUF-loaded model: the dequantized
            # weights as one safetensors file (a tied head once) and the config are enough.
            state = {k: v.contiguous() for k, v in model.state_dict().items()}
            if model.config.tie_word_embeddings:
                state.pop("lm_head.weight", None)
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            hf_dir.mkdir(parents=True)
            model.config.save_pretrained(hf_dir)
            save_file(state, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
            del model, state
        else:
            hf_dir = path
    import_checkpoint(hf_dir, store, progress=False)
    config = json.loads((hf_dir / "config.json").read_text())
    max_len = min(int(config.get("max_position_embeddings", 1024)), 8192) if real else 1024
    name = spec if spec in PRESETS or spec == "smollm2" else Path(spec).stem
    return {
        "name": name,
        "source": source,
        "hf_dir": hf_dir,
        "store": store,
        "vocab": int(config["vocab_size"]),
        "max_len": max_len,
        "real": real,
    }
