"""`policy.placement.tp_size` and `model_home`: the fewest GPUs of one machine that hold a
model, and the node group it runs on."""

from dataclasses import replace

from surge.policy.placement import GpuGroup, model_home, tp_size
from surge.policy.systems import system_config

GIB = 1 << 30
SMALL = GpuGroup(memory_bytes=24 * GIB, gpus_per_node=4)
LARGE = GpuGroup(memory_bytes=80 * GIB, gpus_per_node=1)


def test_tp_size_doubles_until_the_weights_fit_with_room_for_kv() -> None:
    # 24 GiB x 0.9 usable x 0.9 for weights / 1.1 headroom = 17.7 GiB per GPU
    assert tp_size(SMALL, 17 * GIB, 0.9) == 1
    assert tp_size(SMALL, 18 * GIB, 0.9) == 2
    assert tp_size(SMALL, 60 * GIB, 0.9) == 4
    assert tp_size(SMALL, 80 * GIB, 0.9) is None  # the whole machine cannot


def test_model_home_takes_the_group_with_the_fewest_gpus() -> None:
    lam = system_config("lambdascale")
    assert model_home([SMALL, LARGE], 30 * GIB, lam, 0.9) == (1, 1)
    assert model_home([SMALL, LARGE], 10 * GIB, lam, 0.9) == (0, 1)  # ties: the first
    assert model_home([LARGE], 200 * GIB, lam, 0.9) is None


def test_a_parallel_registry_group_may_hold_a_stage_only() -> None:
    para = replace(system_config("paraserve"), pipeline_size=4)
    one_gpu = GpuGroup(memory_bytes=24 * GIB, gpus_per_node=1)
    # no machine holds 40 GiB whole; a quarter fits one GPU
    assert model_home([one_gpu], 40 * GIB, para, 0.9) == (0, 1)
    assert model_home([one_gpu], 40 * GIB, system_config("lambdascale"), 0.9) is None
