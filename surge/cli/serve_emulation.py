"""`surge serve --emulate PRESET:MODEL [--time-dilation D]`: the flags (or config-file keys
`emulate`, `time_dilation`) checked and turned into the `Emulation` the controller's launcher
applies (docs/emulation.md). Every bad or conflicting value is one `SurgeError` line before
anything starts.
"""

import logging
from pathlib import Path
from typing import Any

from surge.emulation import Emulation, EmulationConfig
from surge.errors import SurgeError

log = logging.getLogger(__name__)


def emulation_config(cfg: dict[str, Any], launcher: str) -> EmulationConfig | None:
    """The `EmulationConfig` of `--emulate` / `--time-dilation` (or the config file), or
    None; one `SurgeError` line for a bad or conflicting value."""
    if cfg.get("emulate") is None:
        if cfg.get("time_dilation") is not None:
            raise SurgeError("--time-dilation needs --emulate PRESET:MODEL")
        return None
    if launcher != "local":
        raise SurgeError("--emulate needs --launcher local (a loopback or netns cluster)")
    if cfg.get("link_gbps") is not None or cfg.get("egress_gbps") or cfg.get("host_groups"):
        raise SurgeError(
            "--emulate takes links and host groups from its preset; drop --link-gbps, "
            "egress_gbps/ingress_gbps and host_groups"
        )
    dilation = cfg.get("time_dilation")
    return EmulationConfig.parse(str(cfg["emulate"]), 1.0 if dilation is None else float(dilation))


UNEQUAL_BLOCKS = 1.01
"""A store whose largest block is more than this over its mean block is not an equal-block
store (`surge model import --equal-blocks` pads every block to the largest)."""


def emulated_store(
    emulation: EmulationConfig, deployments: list, num_nodes: int, cluster: str = "loopback"
) -> Emulation:
    """The `Emulation` of `emulation` over the store to serve (the first deployment's, else
    the default tiny model): its bytes set every rate's scale. Checks `num_nodes` fits. On
    `--cluster netns` a store of unequal blocks is warned of: the kernel shapes bytes, so
    its end blocks (embeddings, head) cross each link slower than one emulated block (on
    loopback the agents charge every block as one: `emulation.block_charges`)."""
    from surge.model.default_store import default_store
    from surge.model.manifest import MANIFEST_NAME, read_manifest

    store = Path(deployments[0]["model"]) if deployments else default_store()
    if not (store / MANIFEST_NAME).is_file():
        raise SurgeError(
            f"--emulate scales rates by the served store's size: {store} is not a surge store "
            "(import it first: surge model import CHECKPOINT STORE --equal-blocks)"
        )
    manifest = read_manifest(store)
    out = Emulation.for_store(emulation, manifest)
    out.nodes(num_nodes)  # a count past the preset's GPUs is one error line now
    sizes = [b.size_bytes for b in manifest.blocks]
    over = max(sizes) * len(sizes) / sum(sizes) if sum(sizes) else 1.0
    if cluster == "netns" and over > UNEQUAL_BLOCKS:
        log.warning(
            "%s has unequal blocks (the largest %.2fx the mean): on --cluster netns they do "
            "not each move as one emulated block; import it with `surge model import SOURCE "
            "STORE --equal-blocks` (docs/emulation.md, Blocks)",
            store, over,
        )  # fmt: skip
    return out
