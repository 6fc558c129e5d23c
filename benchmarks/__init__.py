"""Benchmarks (source checkout only, not in the wheel): ``micro/`` (one part alone), ``scenarios/``
(whole clusters against peers), ``harness/`` (what only benchmarks use). The replay client, the
cluster harness and the simulator they drive are ``radix_global_tools``."""
