"""Decisions about machines: whether a model fits a machine, and whether a node is healthy."""
