"""runtime/migration/failures.py: one level for every failed K/V move. An agent's refusal of
another version's K/V is a WARNING (a deployment mixing versions, never a race); a dead
agent, a full instance or a cancelled move, whose request is simply prefilled again, INFO."""

import logging

from surge.policy.versions import refuse_kv
from surge.runtime.endpoints import EndpointFailed
from surge.runtime.migration.failures import failure_level
from surge.runtime.transport import RemoteError

V1, V2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def test_a_refusal_of_another_versions_kv_is_a_warning() -> None:
    why = refuse_kv("m", 1, V2, V1)
    assert failure_level(RemoteError(f"agent 1: instance_adopt: {why}")) == logging.WARNING


def test_any_other_failed_move_is_info() -> None:
    assert failure_level(RemoteError("agent 1: no room for request r1")) == logging.INFO
    assert failure_level(EndpointFailed("node 2 is gone")) == logging.INFO
    assert failure_level(ConnectionResetError()) == logging.INFO
