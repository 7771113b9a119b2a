from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProfilerFile(_message.Message):
    __slots__ = ("path", "container_id", "container", "size_bytes", "mtime", "rank", "host_pid", "found_by")
    PATH_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MTIME_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    HOST_PID_FIELD_NUMBER: _ClassVar[int]
    FOUND_BY_FIELD_NUMBER: _ClassVar[int]
    path: str
    container_id: str
    container: str
    size_bytes: int
    mtime: float
    rank: int
    host_pid: int
    found_by: str
    def __init__(self, path: _Optional[str] = ..., container_id: _Optional[str] = ..., container: _Optional[str] = ..., size_bytes: _Optional[int] = ..., mtime: _Optional[float] = ..., rank: _Optional[int] = ..., host_pid: _Optional[int] = ..., found_by: _Optional[str] = ...) -> None: ...

class ListProfilerFilesRequest(_message.Message):
    __slots__ = ("pod_uid",)
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    pod_uid: str
    def __init__(self, pod_uid: _Optional[str] = ...) -> None: ...

class ListProfilerFilesReply(_message.Message):
    __slots__ = ("pod_uid", "pod_name", "pod_namespace", "node_name", "files", "skipped")
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    POD_NAME_FIELD_NUMBER: _ClassVar[int]
    POD_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    pod_uid: str
    pod_name: str
    pod_namespace: str
    node_name: str
    files: _containers.RepeatedCompositeFieldContainer[ProfilerFile]
    skipped: int
    def __init__(self, pod_uid: _Optional[str] = ..., pod_name: _Optional[str] = ..., pod_namespace: _Optional[str] = ..., node_name: _Optional[str] = ..., files: _Optional[_Iterable[_Union[ProfilerFile, _Mapping]]] = ..., skipped: _Optional[int] = ...) -> None: ...

class FetchProfilerFileRequest(_message.Message):
    __slots__ = ("pod_uid", "container_id", "path", "max_bytes")
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    pod_uid: str
    container_id: str
    path: str
    max_bytes: int
    def __init__(self, pod_uid: _Optional[str] = ..., container_id: _Optional[str] = ..., path: _Optional[str] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class FileChunk(_message.Message):
    __slots__ = ("data", "offset", "size_bytes", "mtime")
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MTIME_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    offset: int
    size_bytes: int
    mtime: float
    def __init__(self, data: _Optional[bytes] = ..., offset: _Optional[int] = ..., size_bytes: _Optional[int] = ..., mtime: _Optional[float] = ...) -> None: ...
