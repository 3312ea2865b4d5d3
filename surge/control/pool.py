"""The parameter pool: where every copy of every block of every model is (BlitzScale §5.3).

model -> block -> {(node, tier)}. Filled from the agents' `status` when the controller
starts (agents re-register what they hold) and kept current from arrival events and the
controller's own loads and evictions, of the deployment's version only (its digest: a copy
of another version under the same name is never a source, `policy.versions`). Answers the
questions a scale-out asks: which nodes hold a complete copy in a tier (hot = gpu, warm =
host), which hold it on disk, and whether the BlitzScale invariant (one complete host copy
per deployed model) holds.

A gpu copy is either a node's own or, in a host group, a mate's device copy opened through
IPC (`open_mate_copy`, arrivals with source `mate`): `shared_from` knows which, so a
node's death takes the copies its mates mapped from it along (docs/gpu.md).
"""

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from surge.policy.versions import same_version
from surge.runtime.protocol import StatusReply

TIERS = ("gpu", "host", "disk")


@dataclass
class ParameterPool:
    """Copies by model, block and (node, tier)."""

    num_blocks: dict[str, int] = field(default_factory=dict)
    copies: dict[str, dict[int, set[tuple[int, str]]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(set))
    )
    shared_from: dict[str, dict[int, int]] = field(default_factory=lambda: defaultdict(dict))
    """model -> node -> the host mate whose device copy that node's gpu tier maps."""
    versions: dict[str, str] = field(default_factory=dict)
    """model -> the version its copies are (`Manifest.digest`; none: any, a pool filled by
    hand): an agent's copies of another version are not taken in (`load_status`)."""

    def add_model(self, model: str, num_blocks: int, digest: str = "") -> None:
        self.num_blocks[model] = num_blocks
        if digest:
            self.versions[model] = digest

    def drop_model(self, model: str) -> None:
        self.num_blocks.pop(model, None)
        self.versions.pop(model, None)
        self.copies.pop(model, None)
        self.shared_from.pop(model, None)

    def add_shared(self, model: str, node: int, owner: int, blocks: Iterable[int]) -> None:
        """`node` mapped `owner`'s device copy of `blocks` (a gpu copy that lives on
        `owner`'s device)."""
        self.add(model, node, "gpu", blocks)
        self.shared_from[model][node] = owner

    def add(self, model: str, node: int, tier: str, blocks: Iterable[int]) -> None:
        for b in blocks:
            self.copies[model][b].add((node, tier))

    def remove(self, model: str, node: int, tier: str, blocks: Iterable[int]) -> None:
        for b in blocks:
            self.copies[model][b].discard((node, tier))

    def drop_node(self, node: int) -> None:
        """A node died: every copy it held is gone, and so are its mates' gpu copies that
        mapped its device memory."""
        for model, per_block in self.copies.items():
            sharers = [n for n, owner in self.shared_from[model].items() if owner == node]
            for holders in per_block.values():
                for tier in TIERS:
                    holders.discard((node, tier))
                for sharer in sharers:
                    holders.discard((sharer, "gpu"))
            for gone in (node, *sharers):
                self.shared_from[model].pop(gone, None)

    def load_status(self, node: int, status: StatusReply) -> None:
        """Take in one agent's `status` answer (what it holds, tier by tier); a model it holds
        at another version than the pool's is no copy of it (`policy.versions`)."""
        for model, holding in status.models.items():
            if model not in self.num_blocks:
                continue
            wanted = self.versions.get(model)
            if wanted is not None and not same_version(holding.digest, wanted):
                continue
            for tier in TIERS:
                self.add(model, node, tier, getattr(holding, tier))

    def blocks_at(self, model: str, node: int, tier: str) -> set[int]:
        return {b for b, holders in self.copies[model].items() if (node, tier) in holders}

    def complete(self, model: str, tier: str) -> list[int]:
        """Nodes holding every block of `model` in `tier`, ascending."""
        n = self.num_blocks.get(model, 0)
        if n == 0:
            return []
        nodes: set[int] | None = None
        for b in range(n):
            have = {node for node, t in self.copies[model][b] if t == tier}
            nodes = have if nodes is None else nodes & have
        return sorted(nodes or ())

    def invariant_holds(self, model: str) -> bool:
        """BlitzScale §5.3: at least one complete copy in some node's host memory."""
        return bool(self.complete(model, "host"))

    def view(self) -> dict[str, dict[str, dict[str, list[int]]]]:
        """model -> "node/tier" -> blocks (for the admin API)."""
        out: dict[str, dict[str, dict[str, list[int]]]] = {}
        for model, per_block in self.copies.items():
            m: dict[str, dict[str, list[int]]] = {}
            for b, holders in sorted(per_block.items()):
                for node, tier in holders:
                    m.setdefault(str(node), {}).setdefault(tier, []).append(b)
            out[model] = m
        return out
