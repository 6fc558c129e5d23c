"""Helpers only the benchmarks use: stand-in processes, clients, PD cluster, reuse, paths."""
