"""SGLang integration: launch wrapper, CPU compatibility, HiCache L3 pool backend."""
