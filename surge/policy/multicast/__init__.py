"""Multicast planning: who sends which block to whom, and the execution pipelines a plan forms
(λScale §4, BlitzScale §5.1, FaaSNet baselines).
"""
