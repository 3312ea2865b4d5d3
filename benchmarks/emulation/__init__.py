"""Benchmarks on the GPU-time emulation (docs/emulation.md): real agents in the papers' regime."""
