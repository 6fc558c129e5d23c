"""Benchmarks and the trace replayer/simulator."""
