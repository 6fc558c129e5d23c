"""Replay a Mooncake-format trace against a router: ``radix-global replay``
(:mod:`.client`); the scaling rules (:mod:`.plan`) and the metrics (:mod:`.stats`)."""
