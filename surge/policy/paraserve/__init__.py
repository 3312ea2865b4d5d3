"""ParaServe's decisions: pipeline-group size (Alg. 1), contention-aware placement (Alg. 2), GPU
shares and consolidation (§4, §6).
"""
