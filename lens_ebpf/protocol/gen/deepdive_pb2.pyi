from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProcessTreeRequest(_message.Message):
    __slots__ = ("pod_uid",)
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    pod_uid: str
    def __init__(self, pod_uid: _Optional[str] = ...) -> None: ...

class HeldDevice(_message.Message):
    __slots__ = ("path", "index", "vendor")
    PATH_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    path: str
    index: int
    vendor: str
    def __init__(self, path: _Optional[str] = ..., index: _Optional[int] = ..., vendor: _Optional[str] = ...) -> None: ...

class Process(_message.Message):
    __slots__ = ("host_pid", "host_ppid", "container_pid", "container_ppid", "comm", "cmdline", "exe", "state", "threads", "cpu_seconds", "rss_bytes", "vsize_bytes", "start_time", "is_python", "devices", "gpu_indexes")
    HOST_PID_FIELD_NUMBER: _ClassVar[int]
    HOST_PPID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_PID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_PPID_FIELD_NUMBER: _ClassVar[int]
    COMM_FIELD_NUMBER: _ClassVar[int]
    CMDLINE_FIELD_NUMBER: _ClassVar[int]
    EXE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    VSIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    IS_PYTHON_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEXES_FIELD_NUMBER: _ClassVar[int]
    host_pid: int
    host_ppid: int
    container_pid: int
    container_ppid: int
    comm: str
    cmdline: str
    exe: str
    state: str
    threads: int
    cpu_seconds: float
    rss_bytes: int
    vsize_bytes: int
    start_time: float
    is_python: bool
    devices: _containers.RepeatedCompositeFieldContainer[HeldDevice]
    gpu_indexes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, host_pid: _Optional[int] = ..., host_ppid: _Optional[int] = ..., container_pid: _Optional[int] = ..., container_ppid: _Optional[int] = ..., comm: _Optional[str] = ..., cmdline: _Optional[str] = ..., exe: _Optional[str] = ..., state: _Optional[str] = ..., threads: _Optional[int] = ..., cpu_seconds: _Optional[float] = ..., rss_bytes: _Optional[int] = ..., vsize_bytes: _Optional[int] = ..., start_time: _Optional[float] = ..., is_python: _Optional[bool] = ..., devices: _Optional[_Iterable[_Union[HeldDevice, _Mapping]]] = ..., gpu_indexes: _Optional[_Iterable[int]] = ...) -> None: ...

class ContainerProcesses(_message.Message):
    __slots__ = ("id", "name", "processes")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    processes: _containers.RepeatedCompositeFieldContainer[Process]
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., processes: _Optional[_Iterable[_Union[Process, _Mapping]]] = ...) -> None: ...

class ProcessTreeReply(_message.Message):
    __slots__ = ("pod_uid", "pod_name", "pod_namespace", "node_name", "containers")
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    POD_NAME_FIELD_NUMBER: _ClassVar[int]
    POD_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    pod_uid: str
    pod_name: str
    pod_namespace: str
    node_name: str
    containers: _containers.RepeatedCompositeFieldContainer[ContainerProcesses]
    def __init__(self, pod_uid: _Optional[str] = ..., pod_name: _Optional[str] = ..., pod_namespace: _Optional[str] = ..., node_name: _Optional[str] = ..., containers: _Optional[_Iterable[_Union[ContainerProcesses, _Mapping]]] = ...) -> None: ...

class PySpyRequest(_message.Message):
    __slots__ = ("pod_uid", "pid", "action", "duration_seconds", "rate", "format", "native", "subprocesses", "locals", "task_id")
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    NATIVE_FIELD_NUMBER: _ClassVar[int]
    SUBPROCESSES_FIELD_NUMBER: _ClassVar[int]
    LOCALS_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    pod_uid: str
    pid: int
    action: str
    duration_seconds: int
    rate: int
    format: str
    native: bool
    subprocesses: bool
    locals: bool
    task_id: str
    def __init__(self, pod_uid: _Optional[str] = ..., pid: _Optional[int] = ..., action: _Optional[str] = ..., duration_seconds: _Optional[int] = ..., rate: _Optional[int] = ..., format: _Optional[str] = ..., native: _Optional[bool] = ..., subprocesses: _Optional[bool] = ..., locals: _Optional[bool] = ..., task_id: _Optional[str] = ...) -> None: ...

class PySpyReply(_message.Message):
    __slots__ = ("output", "format", "pid", "seconds", "exited")
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    EXITED_FIELD_NUMBER: _ClassVar[int]
    output: bytes
    format: str
    pid: int
    seconds: float
    exited: bool
    def __init__(self, output: _Optional[bytes] = ..., format: _Optional[str] = ..., pid: _Optional[int] = ..., seconds: _Optional[float] = ..., exited: _Optional[bool] = ...) -> None: ...
