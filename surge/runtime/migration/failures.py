"""How loudly a refused or failed K/V move is logged, one rule for every path that moves K/V.

A consolidation (`consolidation.py`), a live prefill (`runtime/scaleout/live.py`), a P/D
hand-off (`pd_transfer.py`) and a FlexPipe re-cut (`refactor.py`) each give up on a K/V
move the same way (the request is prefilled again, the old stages serve on); what differs
is only why it failed, and that decides the level. Owned by runtime/migration/; it decides
nothing about the request.
"""

import logging

from surge.policy.versions import is_kv_refusal


def failure_level(e: BaseException) -> int:
    """How loudly a failed K/V move is logged: an agent's refusal of another version's K/V
    (`policy.versions.is_kv_refusal`: a deployment mixing versions, never a race) is a
    WARNING; a dead agent or a full instance, whose request is simply prefilled again, INFO."""
    return logging.WARNING if is_kv_refusal(str(e)) else logging.INFO
