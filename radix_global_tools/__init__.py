"""What a user runs beside the serving path: ``radix-global replay`` (:mod:`.replay`, the trace
replay client), ``radix-global cluster`` (:mod:`.cluster`, a local cluster and one over test hosts)
and ``radix-global simulate`` (:mod:`.simulate`, the discrete-event simulator). Installed with the
``[tools]`` extra; ``benchmarks/`` (source checkout only) builds on these."""
