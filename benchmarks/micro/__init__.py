"""Micro-benchmarks: one part alone (index, page keys, pool, policies, router overhead)."""
