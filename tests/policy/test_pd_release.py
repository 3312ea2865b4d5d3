"""`surge.policy.blitzscale.pd_release`: a P/D deployment's release keeps both roles."""

from surge.policy.blitzscale.pd import DECODE, PREFILL, PdInstance
from surge.policy.blitzscale.pd_release import releasable


def _fleet(*roles_held: tuple[str, int]) -> tuple[PdInstance, ...]:
    return tuple(PdInstance(k, role, held, 8) for k, (role, held) in enumerate(roles_held))


def test_the_last_decode_instance_stays_while_prefill_ones_stay() -> None:
    """§6.1's 7B ServerlessLLM run at t = 301.2 s: two busy prefill instances (0, 2), four
    idle decode and two idle prefill ones; the autoscaler (which counts instances) released
    the six idle ones, every decode instance among them, and the next prefilled request
    decoded on its prefill instance. Now the decode instance that idled least stays."""
    p, d = PREFILL, DECODE
    fleet = _fleet((p, 1), (d, 0), (p, 1), (d, 0), (p, 0), (d, 0), (p, 0), (d, 0))
    assert releasable((1, 3, 4, 5, 6, 7), fleet) == (1, 3, 4, 5, 6)


def test_a_pool_of_decode_instances_alone_keeps_a_prefill_one() -> None:
    p, d = PREFILL, DECODE
    fleet = _fleet((p, 0), (p, 0), (d, 2))
    assert releasable((0, 1), fleet) == (0,)
    assert releasable((0,), fleet) == (0,)  # one prefill instance stays anyway


def test_releasing_every_instance_or_an_unknown_one_is_untouched() -> None:
    fleet = _fleet((PREFILL, 0), (DECODE, 0))
    assert releasable((1, 0), fleet) == (1, 0)  # scale to zero
    assert releasable((), fleet) == ()
    assert releasable((-1,), fleet) == (-1,)  # no role (a pipeline): as asked
    assert releasable((1,), fleet) == ()  # the prefill one stays: so does the decode one
