"""Engine benchmarks: throughput, against peers, workers, fused store decode, prefix cache."""
