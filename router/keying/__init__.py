"""What a request *is* in the cache's terms: its prompt as token ids, its tokenizer, its LoRA
adapter and its tenant, which together give the namespace, salt and extra key of its page keys.

May import ``radix_global`` only; never routing, cluster, transport or ``router.config``.
"""
