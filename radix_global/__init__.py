"""radix-global: a cluster-wide radix index of KV-cache pages (which worker, which tier)."""

__version__ = "0.1.0"
