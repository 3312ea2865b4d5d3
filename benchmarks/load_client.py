"""An outside load client drives `surge serve`: GuideLLM, in a venv of its own.

What runs: `surge serve` (the default local cluster and tiny model, or `--nodes`), then two
GuideLLM benchmarks against its OpenAI API, streaming chat completions:
- `constant`: a constant request rate with synthetic prompts of set lengths;
- `replay`: a slice of the Azure LLM 2023 conversation trace (`../shared/traces`), its
  arrival times (scaled by `--time-scale`) and token counts (clipped to the tiny model's
  context), replayed by GuideLLM's trace profile.
TTFT, inter-token latency and end-to-end latency percentiles are taken from GuideLLM's own
JSON report (the client's measurements, not surge's) and written to
benchmarks/results/load_client.json with the machine and settings.

The client's venv (`.venv-guidellm`, git-ignored) gets `torch==2.13.0` first (the CPU wheel
on these machines; an unpinned torch would pull a multi-GB CUDA build) and then
`guidellm==0.8.1`; its tokenizer is the store's own `tokenizer.json`, and
`HF_HUB_OFFLINE=1` keeps it from downloading anything.

Run: `python -m benchmarks.load_client [--rate 2] [--requests 40] [--replay-requests 60]`.
"""

import argparse
import csv
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from surge.cli import serve_process

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / ".venv-guidellm"
GUIDELLM = "guidellm==0.8.1"
TRACE = REPO.parent / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
OUT = REPO / "benchmarks" / "results" / "load_client.json"
MODEL = "surge-tiny"
MAX_PROMPT_TOKENS = 256
MAX_OUTPUT_TOKENS = 64
log = logging.getLogger("load_client")


def ensure_client() -> Path:
    """GuideLLM's venv (made once): torch pinned first, then guidellm."""
    exe = VENV / "bin" / "guidellm"
    if exe.exists():
        return exe
    log.info("installing %s into %s (once)", GUIDELLM, VENV)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)
    subprocess.run([*pip, GUIDELLM], check=True)
    return exe


def start_serve(state: Path, nodes: int) -> tuple[subprocess.Popen, str]:
    """`surge serve` on a free loopback port; returns the process and its URL."""
    cfg = state / "serve.yaml"
    from surge.model.default_store import default_store

    # The tiny model by name: the default model is SmolLM2 where setup imported it.
    tiny = {"name": MODEL, "model": str(default_store())}
    cfg.write_text(yaml.safe_dump({"nodes": nodes, "deployments": [tiny]}))
    args = ["--port", "0", "--config", str(cfg), "--state-dir", str(state / "state")]
    proc, ready = serve_process.start_serve(args, state / "serve.log", cwd=REPO, timeout_s=180)
    return proc, ready["url"]


def replay_slice(path: Path, num_requests: int, time_scale: float) -> list[dict[str, Any]]:
    """The trace's first `num_requests` rows: seconds from the first arrival (scaled),
    prompt and output tokens clipped to what the tiny model serves."""
    rows: list[dict[str, Any]] = []
    with path.open() as f:
        for row in csv.DictReader(f):
            t = datetime.fromisoformat(row["TIMESTAMP"][:26])
            rows.append(
                {
                    "t": t,
                    "prompt_tokens": max(1, min(int(row["ContextTokens"]), MAX_PROMPT_TOKENS)),
                    "output_tokens": max(1, min(int(row["GeneratedTokens"]), MAX_OUTPUT_TOKENS)),
                }
            )
            if len(rows) == num_requests:
                break
    t0 = rows[0]["t"]
    return [
        {
            "timestamp": round((r["t"] - t0).total_seconds() * time_scale, 6),
            "prompt_tokens": r["prompt_tokens"],
            "output_tokens": r["output_tokens"],
        }
        for r in rows
    ]


def run_guidellm(exe: Path, scenario: dict[str, Any], out: Path, work: Path) -> dict[str, Any]:
    """One GuideLLM run from a scenario file; its JSON report."""
    path = work / f"{out.stem}.scenario.json"
    path.write_text(json.dumps({"spec": scenario}))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [str(exe), "run", "--scenario", str(path), "--output", f"kind=json,path={out}"]
    cmd.append("--disable-console-interactive")
    subprocess.run(cmd, check=True, env=env, cwd=work, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def percentiles(report: dict[str, Any]) -> dict[str, Any]:
    """TTFT, ITL and e2e latency (ms) and request counts from GuideLLM's report."""
    bench = report["benchmarks"][0]
    metrics = bench["metrics"]
    out: dict[str, Any] = {
        "successful": len(bench["requests"].get("successful") or []),
        "errored": len(bench["requests"].get("errored") or []),
        "incomplete": len(bench["requests"].get("incomplete") or []),
    }
    for key, name, scale in (
        ("time_to_first_token_ms", "ttft_ms", 1.0),
        ("inter_token_latency_ms", "itl_ms", 1.0),
        ("request_latency", "e2e_ms", 1000.0),
    ):
        stats = metrics[key]["successful"]
        pct = stats["percentiles"]
        out[name] = {
            "mean": round(stats["mean"] * scale, 2),
            "p50": round(pct["p50"] * scale, 2),
            "p90": round(pct["p90"] * scale, 2),
            "p99": round(pct["p99"] * scale, 2),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--rate", type=float, default=2.0, help="constant run: requests/s")
    ap.add_argument("--requests", type=int, default=40, help="constant run: requests")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--replay-requests", type=int, default=60)
    ap.add_argument("--time-scale", type=float, default=1.0, help="replay: arrival time factor")
    ap.add_argument("--json", type=Path, default=OUT)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    exe = ensure_client()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        proc, url = start_serve(work, args.nodes)
        try:
            tokenizer_dir = _store_dir(url)
            backend = {"kind": "openai_http", "target": url, "model": MODEL}
            tokenizer = {"kind": "huggingface_auto", "model": str(tokenizer_dir)}
            constant = run_guidellm(
                exe,
                {
                    "backend": backend,
                    "tokenizer": tokenizer,
                    "data": [
                        {
                            "kind": "synthetic_text",
                            "prompt_tokens": args.prompt_tokens,
                            "output_tokens": args.output_tokens,
                        }
                    ],
                    "profile": {"kind": "constant", "rate": args.rate},
                    "constraints": [{"kind": "max_requests", "count": args.requests}],
                },
                work / "constant.json",
                work,
            )
            trace = work / "trace.jsonl"
            rows = replay_slice(TRACE, args.replay_requests, args.time_scale)
            trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
            replay = run_guidellm(
                exe,
                {
                    "backend": backend,
                    "tokenizer": tokenizer,
                    "data": [
                        {
                            "kind": "trace_synthetic",
                            "source": {"kind": "json_file", "path": str(trace)},
                            "timestamp_column": "timestamp",
                            "prompt_tokens_column": "prompt_tokens",
                            "output_tokens_column": "output_tokens",
                        }
                    ],
                    "profile": {"kind": "replay"},
                },
                work / "replay.json",
                work,
            )
        finally:
            proc.terminate()
            proc.wait(60)
    for name, report in (("constant", constant), ("replay", replay)):
        errored = report["benchmarks"][0]["requests"].get("errored") or []
        if errored:  # the client's requests must all be served, or the percentiles lie
            first = errored[0].get("info")
            raise SystemExit(f"error: {len(errored)} {name} requests failed: {first}")
    result = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "settings": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "client": GUIDELLM,
            "model": MODEL,
            "trace": TRACE.name,
        },
        "constant": percentiles(constant),
        "replay": percentiles(replay),
    }
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    log.info("%s", json.dumps(result, indent=1))


def _store_dir(url: str) -> Path:
    """The served model's store (its tokenizer.json is the client's tokenizer)."""
    from surge.model.default_store import surge_home

    store = surge_home() / "models" / MODEL
    if not (store / "tokenizer.json").is_file():
        raise RuntimeError(f"no tokenizer at {store}; is SURGE_HOME the server's?")
    httpx.get(url + "/v1/models", timeout=30).raise_for_status()
    return store


if __name__ == "__main__":
    main()
