"""The real body of surge: node agents, block transport, multicast execution, launchers.

Executes plans from `surge.policy` with real processes and real bytes. Never
re-implements a policy.
"""
