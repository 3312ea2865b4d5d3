"""policy.admission: when the hold queue refuses (429), when a held request gives up (503),
what Retry-After says, and the capacity check of min_replicas."""

import pytest

from surge.errors import SurgeError
from surge.policy.admission import (
    MAX_RETRY_AFTER_S,
    AdmissionSettings,
    admit,
    check_min_replicas,
    hold_expired,
    instance_capacity,
)


def test_a_request_joins_the_queue_below_its_bound_and_is_refused_at_it() -> None:
    s = AdmissionSettings(max_queued_requests=3, hold_timeout_s=10)
    assert admit(0, s) is None
    assert admit(2, s) is None
    r = admit(3, s)
    assert r is not None and r.status == 429 and r.retry_after_s >= 1
    assert "max_queued_requests 3" in r.reason
    assert admit(50, s).status == 429


def test_a_held_request_expires_at_its_timeout_unless_it_has_tokens() -> None:
    s = AdmissionSettings(max_queued_requests=8, hold_timeout_s=2.5)
    assert hold_expired(2.4, False, s) is None
    r = hold_expired(2.5, False, s)
    assert r is not None and r.status == 503 and r.retry_after_s == 3
    assert "hold_timeout_s 2.5" in r.reason
    assert hold_expired(100, True, s) is None  # moved mid-answer: it continues


def test_retry_after_is_whole_seconds_within_bounds() -> None:
    assert hold_expired(1, False, AdmissionSettings(hold_timeout_s=0.1)).retry_after_s == 1
    long = AdmissionSettings(hold_timeout_s=3600)
    assert hold_expired(3600, False, long).retry_after_s == MAX_RETRY_AFTER_S


@pytest.mark.parametrize(
    "kw",
    [
        {"max_queued_requests": 0},
        {"max_queued_requests": True},
        {"max_queued_requests": 1.5},
        {"hold_timeout_s": 0},
        {"hold_timeout_s": -1},
        {"hold_timeout_s": float("inf")},
        {"hold_timeout_s": "1"},
    ],
)
def test_bad_settings_are_refused(kw) -> None:
    with pytest.raises(SurgeError):
        AdmissionSettings(**kw)


def test_min_replicas_beyond_the_cluster_is_refused_with_its_capacity() -> None:
    assert instance_capacity(4, 1) == 4
    assert instance_capacity(4, 2) == 4  # one instance of a deployment per node
    check_min_replicas(4, 4, 1)
    with pytest.raises(SurgeError, match=r"4 nodes x 2 slots.*at most 4 instances"):
        check_min_replicas(1000, 4, 2)
