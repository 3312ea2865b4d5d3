"""GPU allocation in the simulator, and its time series (`SimResult.gpu_changes`).

What flows: whole GPUs (`take`, `give_back`) and shares of one GPU (`take_share`,
`give_back_share`: ParaServe's low-memory workers, `policy/paraserve/gpu_share.py`) held
and released by the scaler, ParaServe groups and FlexPipe; the cluster state's free set and
per-GPU shares change, and every change is appended to the GPU-seconds series. Owned by
the simulator; which GPUs and how much of each is decided in `surge/policy/`.
"""

from surge.policy.paraserve.gpu_share import SHARE_EPS
from surge.sim.placement import Placement
from surge.sim.world import World


class Gpus:
    """GPU allocation and its time series (`SimResult.gpu_changes`)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.allocated: float = 0
        """GPUs held now, a shared GPU counted by the shares held."""

    def take(self, gpus: tuple[int, ...]) -> None:
        """Allocate `gpus` (free ones)."""
        self.world.state.free_gpus.difference_update(gpus)
        self._change(len(gpus))

    def give_back(self, gpus: tuple[int, ...]) -> None:
        """Free `gpus`."""
        self.world.state.free_gpus.update(gpus)
        self._change(-len(gpus))

    def take_share(self, gpu: int, share: float) -> None:
        """Hold `share` of `gpu` (free, or shared with room for it); GPU-seconds count
        the share."""
        if share >= 1.0:
            self.take((gpu,))
            return
        state = self.world.state
        state.free_gpus.discard(gpu)
        state.gpu_used[gpu] = state.gpu_used.get(gpu, 0.0) + share
        self._change(share)

    def give_back_share(self, gpu: int, share: float) -> None:
        """Release `share` of `gpu`; the GPU is free again once nothing of it is held."""
        state = self.world.state
        left = state.gpu_used.get(gpu, 0.0) - share
        if left <= SHARE_EPS:
            state.gpu_used.pop(gpu, None)
            state.free_gpus.add(gpu)
        else:
            state.gpu_used[gpu] = left
        self._change(-share)

    def make_whole(self, gpu: int) -> None:
        """One worker now holds all of shared `gpu` (it grew in place, ParaServe §6.1):
        from here on it holds the GPU whole."""
        self.world.state.gpu_used.pop(gpu)

    def take_placement(self, placement: Placement) -> None:
        """Hold every worker's GPUs (or its share of its GPU)."""
        for i, w in enumerate(placement.workers):
            if placement.share(i) < 1.0:
                self.take_share(w[0], placement.share(i))
            else:
                self.take(w)

    def give_back_placement(self, placement: Placement) -> None:
        """Release what `take_placement` held."""
        for i, w in enumerate(placement.workers):
            if placement.share(i) < 1.0:
                self.give_back_share(w[0], placement.share(i))
            else:
                self.give_back(w)

    def _change(self, delta: float) -> None:
        self.allocated += delta
        self.world.result.gpu_changes.append((self.world.loop.now_s, self.allocated))
