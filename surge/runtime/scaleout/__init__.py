"""One scale-out orchestrator: the controller builds a `ScaleOutContext` and awaits
`run_scale_out`; every choice comes from `surge.policy` (startup, loading, multicast,
paraserve sizing/placement/predictor, zigzag). See docs/scaleout.md."""

from surge.runtime.scaleout.context import (
    ControllerHooks,
    ControllerSide,
    ScaleOutContext,
    ScaleOutReport,
    group_name,
    instance_name,
    pipeline_name,
    stage_layers,
)
from surge.runtime.scaleout.run import run_scale_out

__all__ = [
    "ControllerHooks",
    "ControllerSide",
    "ScaleOutContext",
    "ScaleOutReport",
    "group_name",
    "instance_name",
    "pipeline_name",
    "run_scale_out",
    "stage_layers",
]
