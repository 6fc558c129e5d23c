"""The Conductor: a KV-cache-centric router in front of SGLang/vLLM workers."""
