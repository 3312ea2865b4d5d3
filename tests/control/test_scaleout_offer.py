"""What the controller offers each scale-out from its settings: the gloo group's per-block
wait bound is `ControllerConfig.group_block_bound`, validated where the config is made, and
reaches the scale-out's offer (`ScaleOutOffer` -> `ScaleOutContext.group_block_bound`)."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from surge.control.settings import ControllerConfig
from surge.errors import SurgeError
from surge.policy.multicast.group_block_bound import GroupBlockBound
from tests.control.scripted import bare_autoscaler


@pytest.mark.parametrize("bound", [None, GroupBlockBound(factor=1.5, floor_s=1.0)])
def test_the_group_block_bound_reaches_the_offer(bound: GroupBlockBound | None) -> None:
    given = {} if bound is None else {"group_block_bound": bound}
    config = ControllerConfig(state_dir=Path("/nonexistent"), **given)
    scaler = bare_autoscaler(config, started_s=0.0)
    offer = scaler.offer(SimpleNamespace(instances={}), [0], [])  # type: ignore[arg-type]
    assert offer.group_block_bound == (bound or GroupBlockBound())


def test_a_bad_group_block_bound_never_makes_a_config() -> None:
    with pytest.raises(SurgeError, match="factor must be >= 1"):
        ControllerConfig(state_dir=Path("/nonexistent"), group_block_bound=GroupBlockBound(0.5))
