from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterRequest(_message.Message):
    __slots__ = ("worker_info_json",)
    WORKER_INFO_JSON_FIELD_NUMBER: _ClassVar[int]
    worker_info_json: bytes
    def __init__(self, worker_info_json: _Optional[bytes] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("worker_id", "subscribed")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBED_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    subscribed: bool
    def __init__(self, worker_id: _Optional[str] = ..., subscribed: _Optional[bool] = ...) -> None: ...

class WorkerRef(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class HolderRef(_message.Message):
    __slots__ = ("holder",)
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    holder: str
    def __init__(self, holder: _Optional[str] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NamespaceRequest(_message.Message):
    __slots__ = ("namespace", "page_size")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    page_size: int
    def __init__(self, namespace: _Optional[str] = ..., page_size: _Optional[int] = ...) -> None: ...

class MatchRequest(_message.Message):
    __slots__ = ("namespace", "keys")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    keys: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, namespace: _Optional[str] = ..., keys: _Optional[_Iterable[int]] = ...) -> None: ...

class HolderMatch(_message.Message):
    __slots__ = ("holder", "dp_rank", "gpu", "host", "pool")
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    holder: str
    dp_rank: int
    gpu: int
    host: int
    pool: int
    def __init__(self, holder: _Optional[str] = ..., dp_rank: _Optional[int] = ..., gpu: _Optional[int] = ..., host: _Optional[int] = ..., pool: _Optional[int] = ...) -> None: ...

class StoreSpan(_message.Message):
    __slots__ = ("end_page", "segments")
    END_PAGE_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    end_page: int
    segments: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, end_page: _Optional[int] = ..., segments: _Optional[_Iterable[str]] = ...) -> None: ...

class StoreRun(_message.Message):
    __slots__ = ("store", "spans")
    STORE_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    store: str
    spans: _containers.RepeatedCompositeFieldContainer[StoreSpan]
    def __init__(self, store: _Optional[str] = ..., spans: _Optional[_Iterable[_Union[StoreSpan, _Mapping]]] = ...) -> None: ...

class MatchReply(_message.Message):
    __slots__ = ("query_pages", "matched", "best_pages", "best_holders", "store_runs")
    QUERY_PAGES_FIELD_NUMBER: _ClassVar[int]
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    BEST_PAGES_FIELD_NUMBER: _ClassVar[int]
    BEST_HOLDERS_FIELD_NUMBER: _ClassVar[int]
    STORE_RUNS_FIELD_NUMBER: _ClassVar[int]
    query_pages: int
    matched: _containers.RepeatedCompositeFieldContainer[HolderMatch]
    best_pages: int
    best_holders: _containers.RepeatedScalarFieldContainer[str]
    store_runs: _containers.RepeatedCompositeFieldContainer[StoreRun]
    def __init__(self, query_pages: _Optional[int] = ..., matched: _Optional[_Iterable[_Union[HolderMatch, _Mapping]]] = ..., best_pages: _Optional[int] = ..., best_holders: _Optional[_Iterable[str]] = ..., store_runs: _Optional[_Iterable[_Union[StoreRun, _Mapping]]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsReply(_message.Message):
    __slots__ = ("stats_json",)
    STATS_JSON_FIELD_NUMBER: _ClassVar[int]
    stats_json: bytes
    def __init__(self, stats_json: _Optional[bytes] = ...) -> None: ...

class HotPrefixesRequest(_message.Message):
    __slots__ = ("namespace", "top_k")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    top_k: int
    def __init__(self, namespace: _Optional[str] = ..., top_k: _Optional[int] = ...) -> None: ...

class HotPrefix(_message.Message):
    __slots__ = ("keys", "pages", "hit_rate", "holders")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[int]
    pages: int
    hit_rate: float
    holders: int
    def __init__(self, keys: _Optional[_Iterable[int]] = ..., pages: _Optional[int] = ..., hit_rate: _Optional[float] = ..., holders: _Optional[int] = ...) -> None: ...

class HotPrefixesReply(_message.Message):
    __slots__ = ("prefixes",)
    PREFIXES_FIELD_NUMBER: _ClassVar[int]
    prefixes: _containers.RepeatedCompositeFieldContainer[HotPrefix]
    def __init__(self, prefixes: _Optional[_Iterable[_Union[HotPrefix, _Mapping]]] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SnapshotReply(_message.Message):
    __slots__ = ("path", "size_bytes", "seconds")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    path: str
    size_bytes: int
    seconds: float
    def __init__(self, path: _Optional[str] = ..., size_bytes: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class Location(_message.Message):
    __slots__ = ("holder", "dp_rank", "tier")
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    holder: str
    dp_rank: int
    tier: int
    def __init__(self, holder: _Optional[str] = ..., dp_rank: _Optional[int] = ..., tier: _Optional[int] = ...) -> None: ...

class StorePages(_message.Message):
    __slots__ = ("namespace", "location", "parent", "keys")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    location: Location
    parent: int
    keys: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, namespace: _Optional[str] = ..., location: _Optional[_Union[Location, _Mapping]] = ..., parent: _Optional[int] = ..., keys: _Optional[_Iterable[int]] = ...) -> None: ...

class RemovePages(_message.Message):
    __slots__ = ("namespace", "location", "keys")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    location: Location
    keys: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, namespace: _Optional[str] = ..., location: _Optional[_Union[Location, _Mapping]] = ..., keys: _Optional[_Iterable[int]] = ...) -> None: ...

class ClearHolder(_message.Message):
    __slots__ = ("holder", "tier", "dp_rank")
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    holder: str
    tier: int
    dp_rank: int
    def __init__(self, holder: _Optional[str] = ..., tier: _Optional[int] = ..., dp_rank: _Optional[int] = ...) -> None: ...

class IndexOp(_message.Message):
    __slots__ = ("store", "remove", "clear")
    STORE_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    store: StorePages
    remove: RemovePages
    clear: ClearHolder
    def __init__(self, store: _Optional[_Union[StorePages, _Mapping]] = ..., remove: _Optional[_Union[RemovePages, _Mapping]] = ..., clear: _Optional[_Union[ClearHolder, _Mapping]] = ...) -> None: ...

class ApplyRequest(_message.Message):
    __slots__ = ("ops",)
    OPS_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedCompositeFieldContainer[IndexOp]
    def __init__(self, ops: _Optional[_Iterable[_Union[IndexOp, _Mapping]]] = ...) -> None: ...

class ApplyReply(_message.Message):
    __slots__ = ("applied", "refused")
    class RefusedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    applied: int
    refused: _containers.ScalarMap[str, int]
    def __init__(self, applied: _Optional[int] = ..., refused: _Optional[_Mapping[str, int]] = ...) -> None: ...
