"""FlexPipe's decisions: granularity, partition, placement and inflight refactoring (§5-§7)."""
