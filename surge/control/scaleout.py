"""Moved: the scale-out orchestrator is `surge.runtime.scaleout` (docs/scaleout.md).

These names stay importable from here only while `control/autoscaler.py` and
`control/copies.py` (other owners' files) still import them from this path; import them
from `surge.runtime.scaleout` instead, then delete this file."""

from surge.runtime.scaleout import ScaleOutContext, instance_name, run_scale_out

__all__ = ["ScaleOutContext", "instance_name", "run_scale_out"]
