"""A decode graph's compile waits for its gate (`DecodeGraph(gate=...)`, a node agent's: set
only while the node is quiet, `runtime/node/compile_quiet.py`): no graph compiles while the
gate is clear, each graph waits for it anew (a node busy again after the first graph keeps
the second back), and a step never compiles while its graph waits. Dynamo traces the tiny
model with a recording backend (no inductor)."""

import threading
import time
from pathlib import Path

import torch

from surge.config import EngineConfig
from surge.engine import compiled
from surge.engine.runner import ModelRunner
from surge.model.manifest import read_manifest


def until(cond, timeout_s: float = 300.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_each_graph_compiles_only_while_its_gate_is_set(tiny_store: Path) -> None:
    runner = ModelRunner(read_manifest(tiny_store), EngineConfig(compile_decode=False))
    runner.load_blocks()
    gate = threading.Event()
    traced: list[int] = []

    def backend(gm, example_inputs):  # dynamo's graph, recorded and run as traced
        traced.append(len(example_inputs))
        gate.clear()  # the node got busy while this graph compiled: the next one waits
        return gm.forward

    graph = compiled.DecodeGraph(runner.compile_args, backend=backend, gate=gate)
    assert graph.start([(compiled.MODEL, 1), (compiled.MODEL, 2)])
    until(lambda: graph.num_gate_waits == 1)
    time.sleep(0.5)  # the thread polls its gate: nothing compiles while it is clear
    assert traced == [] and graph.compiling and graph.num_compiles == 0
    # A step meanwhile runs eager: it never compiles on the request path.
    ids = torch.zeros(1, 1, dtype=torch.int64)
    args = runner.compile_args((compiled.MODEL, 1))[1:]
    assert graph.model(ids, *args) is None and graph.num_eager_steps == 1 and traced == []
    gate.set()
    until(lambda: graph.num_gate_waits == 2)  # the second graph waits: the gate closed again
    time.sleep(0.5)
    assert graph.num_compiles == 1 and graph.compiling
    gate.set()
    assert graph.wait(timeout_s=300) and graph.error is None
    assert graph.num_compiles == 2 and len(traced) == 2


def test_without_a_gate_the_graphs_compile_at_once(tiny_store: Path) -> None:
    """A standalone engine (no agent) compiles as before: no gate, no wait."""
    runner = ModelRunner(read_manifest(tiny_store), EngineConfig(compile_decode=False))
    runner.load_blocks()
    graph = compiled.DecodeGraph(runner.compile_args, backend=lambda gm, _: gm.forward)
    assert graph.start([(compiled.MODEL, 1)])
    assert graph.wait(timeout_s=300) and graph.error is None
    assert graph.num_gate_waits == 0 and graph.num_compiles == 1
