"""Where copies of a model are kept outside serving instances.

Host-memory caches, their keep-alive and LRU (`keepalive.py`); the pinned host copy, when
copies expire and when a failed one is tried again (BlitzScale §5.3 O(1) host caching,
`host_copies.py`); which destinations open a host group's device copy (`mate_copies.py`).
"""
