"""Scale-out benchmarks: bursts, cold starts, multicasts and planners."""
