"""Per-system benchmarks: BlitzScale, FlexPipe, zigzag."""
