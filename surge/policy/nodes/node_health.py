"""When a node counts as down and when its agent is started again. Pure: numbers in,
answers out.

- A node whose agent does not answer a status call within `heartbeat_timeout_s` (frozen:
  SIGSTOP, a hung host, a livelock) is treated as down, as if it had been killed: its
  requests re-run elsewhere and its agent is replaced (issue 36: a frozen agent stalled its
  stream with no error and was never noticed).
- A dead agent is restarted after 1, 2, 4, ... s (at most `RESTART_MAX_DELAY_S`), at most
  `max_restarts` times in a row; a node that has stayed up `RESTART_RESET_S` since its last
  restart starts counting again. Past the budget the node stays down (an agent that dies at
  every start would otherwise restart forever) and `/health` says degraded.
`control/healing.py` carries these out.
"""

RESTART_FIRST_DELAY_S = 1.0
RESTART_MAX_DELAY_S = 30.0
RESTART_RESET_S = 300.0
"""Up this long after a restart: the node's restarts in a row start from zero again."""


def restart_delay_s(restarts_in_a_row: int, max_restarts: int) -> float | None:
    """Seconds to wait before restarting an agent that has been restarted
    `restarts_in_a_row` times already; None: give up, the node stays down."""
    if restarts_in_a_row >= max_restarts:
        return None
    return min(RESTART_MAX_DELAY_S, RESTART_FIRST_DELAY_S * 2**restarts_in_a_row)


def restarts_in_a_row(count: int, last_restart_s: float | None, now_s: float) -> int:
    """The count to use now: zero again once the node has been up `RESTART_RESET_S`."""
    if last_restart_s is None or now_s - last_restart_s >= RESTART_RESET_S:
        return 0
    return count
