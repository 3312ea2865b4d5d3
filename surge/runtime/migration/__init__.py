"""Running requests moved between endpoints, their K/V with them.

ParaServe §6 consolidation and BlitzScale live prefill (`consolidation.py`), FlexPipe's
in-flight refactoring (`refactor.py`), the P/D hand-off from a prefill instance to a decode
one (`pd_handoff.py`), the K/V incast the monitor weighs (`kv_ingress.py`) and how loudly a
failed K/V move is logged, the same on every path (`failures.py`).
"""
