def chain_digests(data: bytes | bytearray | memoryview, page_bytes: int,
                  prior: bytes | bytearray | memoryview, /) -> bytes:
    """The SHA-256 chain digests of the pages of ``data`` (32 bytes each, concatenated),
    continuing from ``prior`` (``b""`` or a 32-byte digest). See ``_chainhash.c``."""
