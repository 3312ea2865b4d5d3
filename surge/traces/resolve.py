"""From a `--trace` value to a `Trace`: names of bundled traces, generators, or files.

In: NAME_OR_FILE and the traces directory (default `<repo>/../shared/traces`, or the
`SURGE_TRACES` environment variable). Names:
- `azure-code`, `azure-conv`: the Azure LLM 2023 traces;
- `gamma:rate=R,cv=C,duration=D[,in=I,out=O]`: Gamma arrivals (token lengths resampled
  from azure-conv when it is present and `in`/`out` are not given);
- `servegen:CATEGORY_MODEL[,start=S,duration=D,scale=F]`: ServeGen per-client windows
  (each request's model index is its client's rank);
- `alibaba-genai`: the Alibaba serverless GenAI request trace (model index = base model
  rank; tokens resampled from azure-conv).
Anything else is a file: the path as given (from the current directory), else the same
path under the traces directory (`--traces-dir DIR` + `azure_llm_2023/...csv` works, and
so does a BurstGPT file a user put there). A file is read by its header: Azure
(TIMESTAMP, ContextTokens, GeneratedTokens), BurstGPT (Timestamp, Model, Request
tokens, Response tokens) or the generic CSV (arrival_s, input_tokens, output_tokens[, model]).
"""

import os
from pathlib import Path

from surge.errors import SurgeError
from surge.traces.alibaba_genai import FILE as ALIBABA_FILE
from surge.traces.alibaba_genai import load_alibaba_genai
from surge.traces.azure import load_azure
from surge.traces.burstgpt import load_burstgpt
from surge.traces.csv_columns import open_text
from surge.traces.gamma import gamma_trace
from surge.traces.generic_csv import load_generic
from surge.traces.request import Trace
from surge.traces.servegen import servegen_trace

AZURE_FILES = {
    "azure-code": "azure_llm_2023/AzureLLMInferenceTrace_code.csv",
    "azure-conv": "azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
}
"""Bundled trace names -> path inside the traces directory."""
NAMES = (*AZURE_FILES, "alibaba-genai")
"""Every plain trace name."""

REPO_ROOT = Path(__file__).resolve().parents[2]


def default_traces_dir() -> Path:
    """`$SURGE_TRACES`, else `<repo>/../shared/traces` (shared/ beside the clone)."""
    env = os.environ.get("SURGE_TRACES")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "traces"


def _options(spec: str, allowed: tuple[str, ...]) -> dict[str, str]:
    opts: dict[str, str] = {}
    for part in filter(None, spec.split(",")):
        key, sep, value = part.partition("=")
        if not sep or key not in allowed:
            raise SurgeError(f"bad trace option {part!r}; use key=value with keys {allowed}")
        opts[key] = value
    return opts


def _num(opts: dict[str, str], key: str, default: float | None) -> float:
    if key not in opts:
        if default is None:
            raise SurgeError(f"trace option {key}= is required")
        return default
    try:
        return float(opts[key])
    except ValueError:
        raise SurgeError(f"trace option {key}={opts[key]!r} is not a number") from None


def _donor(traces_dir: Path) -> Trace | None:
    path = traces_dir / AZURE_FILES["azure-conv"]
    return load_azure(path) if path.is_file() else None


def load_file(path: Path) -> Trace:
    """A trace file, its schema chosen by its header."""
    with open_text(path) as fh:
        header = {h.strip() for h in fh.readline().split(",")}
    if "TIMESTAMP" in header:
        return load_azure(path)
    if "Timestamp" in header:
        return load_burstgpt(path)
    return load_generic(path)


def load_trace(spec: str, seed: int = 0, traces_dir: Path | None = None) -> Trace:
    """The trace named or located by `spec` (see module docstring)."""
    traces_dir = traces_dir or default_traces_dir()
    if spec in AZURE_FILES:
        path = traces_dir / AZURE_FILES[spec]
        if not path.is_file():
            raise SurgeError(
                f"trace {spec} not found at {path}; put shared/traces beside the repo "
                "or pass --traces-dir"
            )
        return load_azure(path)
    if spec.startswith("gamma:"):
        opts = _options(spec[6:], ("rate", "cv", "duration", "in", "out"))
        fixed = "in" in opts or "out" in opts
        return gamma_trace(
            _num(opts, "rate", None),
            _num(opts, "cv", 1.0),
            _num(opts, "duration", 600.0),
            seed,
            int(_num(opts, "in", 512)),
            int(_num(opts, "out", 128)),
            None if fixed else _donor(traces_dir),
        )
    if spec.startswith("servegen:"):
        name, _, rest = spec[9:].partition(",")
        opts = _options(rest, ("start", "duration", "scale"))
        path = traces_dir / "servegen_2025" / f"{name}_client_windows.csv.gz"
        if not path.is_file():
            raise SurgeError(f"ServeGen file {path} not found; check the category_model name")
        return servegen_trace(
            path,
            _num(opts, "start", 0.0),
            _num(opts, "duration", 600.0),
            seed,
            _num(opts, "scale", 1.0),
            _donor(traces_dir),
        )
    if spec == "alibaba-genai":
        path = traces_dir / ALIBABA_FILE
        if not path.is_file():
            raise SurgeError(f"trace {spec} not found at {path}; pass --traces-dir")
        return load_alibaba_genai(path, seed, _donor(traces_dir))
    path = Path(spec)
    if not path.is_file() and not path.is_absolute() and (traces_dir / path).is_file():
        path = traces_dir / path
    if not path.is_file():
        raise SurgeError(
            f"unknown trace {spec!r}: not a file (here or under {traces_dir}) and not one "
            f"of {', '.join(NAMES)}, gamma:rate=R,cv=C,duration=D, servegen:NAME"
        )
    return load_file(path)
