"""The node agent process: its sockets and dispatch, block store and tiers, transfer path,
serving (stages, local instances, P/D).
"""
