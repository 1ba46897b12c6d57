"""Benchmarks (commands, not tests): convergence of each codec, and (later) step time on shaped networks."""
