from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Identity(_message.Message):
    __slots__ = ("container_id", "container", "pod", "namespace", "pod_uid", "workload_kind", "workload")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_KIND_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    container: str
    pod: str
    namespace: str
    pod_uid: str
    workload_kind: str
    workload: str
    def __init__(self, container_id: _Optional[str] = ..., container: _Optional[str] = ..., pod: _Optional[str] = ..., namespace: _Optional[str] = ..., pod_uid: _Optional[str] = ..., workload_kind: _Optional[str] = ..., workload: _Optional[str] = ...) -> None: ...

class FlowClosed(_message.Message):
    __slots__ = ("pid", "comm", "cgroup_id", "laddr", "lport", "raddr", "rport", "direction", "sent_bytes", "received_bytes", "retransmits", "duration_ns", "reason", "remote_namespace", "remote_pod", "remote_workload_kind", "remote_workload", "remote_service", "namespace", "pod", "workload_kind", "workload")
    PID_FIELD_NUMBER: _ClassVar[int]
    COMM_FIELD_NUMBER: _ClassVar[int]
    CGROUP_ID_FIELD_NUMBER: _ClassVar[int]
    LADDR_FIELD_NUMBER: _ClassVar[int]
    LPORT_FIELD_NUMBER: _ClassVar[int]
    RADDR_FIELD_NUMBER: _ClassVar[int]
    RPORT_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    CLASS_FIELD_NUMBER: _ClassVar[int]
    SENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    RETRANSMITS_FIELD_NUMBER: _ClassVar[int]
    DURATION_NS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REMOTE_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    REMOTE_POD_FIELD_NUMBER: _ClassVar[int]
    REMOTE_WORKLOAD_KIND_FIELD_NUMBER: _ClassVar[int]
    REMOTE_WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    REMOTE_SERVICE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_KIND_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    pid: int
    comm: str
    cgroup_id: int
    laddr: str
    lport: int
    raddr: str
    rport: int
    direction: str
    sent_bytes: int
    received_bytes: int
    retransmits: int
    duration_ns: int
    reason: str
    remote_namespace: str
    remote_pod: str
    remote_workload_kind: str
    remote_workload: str
    remote_service: str
    namespace: str
    pod: str
    workload_kind: str
    workload: str
    def __init__(self, pid: _Optional[int] = ..., comm: _Optional[str] = ..., cgroup_id: _Optional[int] = ..., laddr: _Optional[str] = ..., lport: _Optional[int] = ..., raddr: _Optional[str] = ..., rport: _Optional[int] = ..., direction: _Optional[str] = ..., sent_bytes: _Optional[int] = ..., received_bytes: _Optional[int] = ..., retransmits: _Optional[int] = ..., duration_ns: _Optional[int] = ..., reason: _Optional[str] = ..., remote_namespace: _Optional[str] = ..., remote_pod: _Optional[str] = ..., remote_workload_kind: _Optional[str] = ..., remote_workload: _Optional[str] = ..., remote_service: _Optional[str] = ..., namespace: _Optional[str] = ..., pod: _Optional[str] = ..., workload_kind: _Optional[str] = ..., workload: _Optional[str] = ..., **kwargs) -> None: ...

class ProcessExec(_message.Message):
    __slots__ = ("pid", "ppid", "comm", "filename", "cgroup_id", "identity")
    PID_FIELD_NUMBER: _ClassVar[int]
    PPID_FIELD_NUMBER: _ClassVar[int]
    COMM_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    CGROUP_ID_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    pid: int
    ppid: int
    comm: str
    filename: str
    cgroup_id: int
    identity: Identity
    def __init__(self, pid: _Optional[int] = ..., ppid: _Optional[int] = ..., comm: _Optional[str] = ..., filename: _Optional[str] = ..., cgroup_id: _Optional[int] = ..., identity: _Optional[_Union[Identity, _Mapping]] = ...) -> None: ...

class ProcessExit(_message.Message):
    __slots__ = ("pid", "ppid", "comm", "exit_code", "signal", "oom_killed", "identity")
    PID_FIELD_NUMBER: _ClassVar[int]
    PPID_FIELD_NUMBER: _ClassVar[int]
    COMM_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    OOM_KILLED_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    pid: int
    ppid: int
    comm: str
    exit_code: int
    signal: int
    oom_killed: bool
    identity: Identity
    def __init__(self, pid: _Optional[int] = ..., ppid: _Optional[int] = ..., comm: _Optional[str] = ..., exit_code: _Optional[int] = ..., signal: _Optional[int] = ..., oom_killed: _Optional[bool] = ..., identity: _Optional[_Union[Identity, _Mapping]] = ...) -> None: ...

class OomKill(_message.Message):
    __slots__ = ("pid", "comm", "identity")
    PID_FIELD_NUMBER: _ClassVar[int]
    COMM_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    pid: int
    comm: str
    identity: Identity
    def __init__(self, pid: _Optional[int] = ..., comm: _Optional[str] = ..., identity: _Optional[_Union[Identity, _Mapping]] = ...) -> None: ...

class ContainerChange(_message.Message):
    __slots__ = ("identity", "devices")
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    identity: Identity
    devices: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, identity: _Optional[_Union[Identity, _Mapping]] = ..., devices: _Optional[_Iterable[str]] = ...) -> None: ...

class DeviceChange(_message.Message):
    __slots__ = ("vendor", "bdf", "change", "device_kind", "key", "index", "model", "uuid", "serial", "driver_version", "firmware_version", "vbios_version", "port_state", "link_layer", "rate", "retired_pages_pending", "row_remap_pending", "row_remap_failure", "fields", "slot", "recovery_action", "holder")
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    BDF_FIELD_NUMBER: _ClassVar[int]
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_KIND_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    FIRMWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    VBIOS_VERSION_FIELD_NUMBER: _ClassVar[int]
    PORT_STATE_FIELD_NUMBER: _ClassVar[int]
    LINK_LAYER_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    RETIRED_PAGES_PENDING_FIELD_NUMBER: _ClassVar[int]
    ROW_REMAP_PENDING_FIELD_NUMBER: _ClassVar[int]
    ROW_REMAP_FAILURE_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_ACTION_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    vendor: str
    bdf: str
    change: str
    device_kind: str
    key: str
    index: int
    model: str
    uuid: str
    serial: str
    driver_version: str
    firmware_version: str
    vbios_version: str
    port_state: str
    link_layer: str
    rate: str
    retired_pages_pending: bool
    row_remap_pending: bool
    row_remap_failure: bool
    fields: _containers.RepeatedScalarFieldContainer[str]
    slot: str
    recovery_action: str
    holder: str
    def __init__(self, vendor: _Optional[str] = ..., bdf: _Optional[str] = ..., change: _Optional[str] = ..., device_kind: _Optional[str] = ..., key: _Optional[str] = ..., index: _Optional[int] = ..., model: _Optional[str] = ..., uuid: _Optional[str] = ..., serial: _Optional[str] = ..., driver_version: _Optional[str] = ..., firmware_version: _Optional[str] = ..., vbios_version: _Optional[str] = ..., port_state: _Optional[str] = ..., link_layer: _Optional[str] = ..., rate: _Optional[str] = ..., retired_pages_pending: _Optional[bool] = ..., row_remap_pending: _Optional[bool] = ..., row_remap_failure: _Optional[bool] = ..., fields: _Optional[_Iterable[str]] = ..., slot: _Optional[str] = ..., recovery_action: _Optional[str] = ..., holder: _Optional[str] = ...) -> None: ...

class DeviceInventory(_message.Message):
    __slots__ = ("devices",)
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[DeviceChange]
    def __init__(self, devices: _Optional[_Iterable[_Union[DeviceChange, _Mapping]]] = ...) -> None: ...

class GpuFault(_message.Message):
    __slots__ = ("gpu_index", "bdf", "uuid", "vendor", "fault", "code", "message", "pid", "identity")
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    BDF_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    FAULT_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    gpu_index: int
    bdf: str
    uuid: str
    vendor: str
    fault: str
    code: str
    message: str
    pid: int
    identity: Identity
    def __init__(self, gpu_index: _Optional[int] = ..., bdf: _Optional[str] = ..., uuid: _Optional[str] = ..., vendor: _Optional[str] = ..., fault: _Optional[str] = ..., code: _Optional[str] = ..., message: _Optional[str] = ..., pid: _Optional[int] = ..., identity: _Optional[_Union[Identity, _Mapping]] = ...) -> None: ...

class RdmaUse(_message.Message):
    __slots__ = ("device", "queue_pairs", "identity")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_PAIRS_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    device: str
    queue_pairs: int
    identity: Identity
    def __init__(self, device: _Optional[str] = ..., queue_pairs: _Optional[int] = ..., identity: _Optional[_Union[Identity, _Mapping]] = ...) -> None: ...

class NodeTuned(_message.Message):
    __slots__ = ("setting", "old_value", "new_value")
    SETTING_FIELD_NUMBER: _ClassVar[int]
    OLD_VALUE_FIELD_NUMBER: _ClassVar[int]
    NEW_VALUE_FIELD_NUMBER: _ClassVar[int]
    setting: str
    old_value: int
    new_value: int
    def __init__(self, setting: _Optional[str] = ..., old_value: _Optional[int] = ..., new_value: _Optional[int] = ...) -> None: ...

class Gap(_message.Message):
    __slots__ = ("lost", "reason")
    LOST_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    lost: int
    reason: str
    def __init__(self, lost: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("seq", "ts_unix_nano", "node_name", "node_ip", "flow_closed", "process_exec", "process_exit", "oom_kill", "container_start", "container_exit", "abnormal_flow", "device_change", "gap", "node_tuned", "gpu_fault", "rdma_open", "rdma_close", "device_inventory")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TS_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    NODE_IP_FIELD_NUMBER: _ClassVar[int]
    FLOW_CLOSED_FIELD_NUMBER: _ClassVar[int]
    PROCESS_EXEC_FIELD_NUMBER: _ClassVar[int]
    PROCESS_EXIT_FIELD_NUMBER: _ClassVar[int]
    OOM_KILL_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_START_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_EXIT_FIELD_NUMBER: _ClassVar[int]
    ABNORMAL_FLOW_FIELD_NUMBER: _ClassVar[int]
    DEVICE_CHANGE_FIELD_NUMBER: _ClassVar[int]
    GAP_FIELD_NUMBER: _ClassVar[int]
    NODE_TUNED_FIELD_NUMBER: _ClassVar[int]
    GPU_FAULT_FIELD_NUMBER: _ClassVar[int]
    RDMA_OPEN_FIELD_NUMBER: _ClassVar[int]
    RDMA_CLOSE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_INVENTORY_FIELD_NUMBER: _ClassVar[int]
    seq: int
    ts_unix_nano: int
    node_name: str
    node_ip: str
    flow_closed: FlowClosed
    process_exec: ProcessExec
    process_exit: ProcessExit
    oom_kill: OomKill
    container_start: ContainerChange
    container_exit: ContainerChange
    abnormal_flow: FlowClosed
    device_change: DeviceChange
    gap: Gap
    node_tuned: NodeTuned
    gpu_fault: GpuFault
    rdma_open: RdmaUse
    rdma_close: RdmaUse
    device_inventory: DeviceInventory
    def __init__(self, seq: _Optional[int] = ..., ts_unix_nano: _Optional[int] = ..., node_name: _Optional[str] = ..., node_ip: _Optional[str] = ..., flow_closed: _Optional[_Union[FlowClosed, _Mapping]] = ..., process_exec: _Optional[_Union[ProcessExec, _Mapping]] = ..., process_exit: _Optional[_Union[ProcessExit, _Mapping]] = ..., oom_kill: _Optional[_Union[OomKill, _Mapping]] = ..., container_start: _Optional[_Union[ContainerChange, _Mapping]] = ..., container_exit: _Optional[_Union[ContainerChange, _Mapping]] = ..., abnormal_flow: _Optional[_Union[FlowClosed, _Mapping]] = ..., device_change: _Optional[_Union[DeviceChange, _Mapping]] = ..., gap: _Optional[_Union[Gap, _Mapping]] = ..., node_tuned: _Optional[_Union[NodeTuned, _Mapping]] = ..., gpu_fault: _Optional[_Union[GpuFault, _Mapping]] = ..., rdma_open: _Optional[_Union[RdmaUse, _Mapping]] = ..., rdma_close: _Optional[_Union[RdmaUse, _Mapping]] = ..., device_inventory: _Optional[_Union[DeviceInventory, _Mapping]] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("kinds", "namespace", "pod", "container", "from_seq")
    KINDS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    kinds: _containers.RepeatedScalarFieldContainer[str]
    namespace: str
    pod: str
    container: str
    from_seq: int
    def __init__(self, kinds: _Optional[_Iterable[str]] = ..., namespace: _Optional[str] = ..., pod: _Optional[str] = ..., container: _Optional[str] = ..., from_seq: _Optional[int] = ...) -> None: ...

class GetNodeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("node_name", "node_ip", "version", "features", "last_seq")
    class FeaturesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    NODE_IP_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    node_ip: str
    version: str
    features: _containers.ScalarMap[str, str]
    last_seq: int
    def __init__(self, node_name: _Optional[str] = ..., node_ip: _Optional[str] = ..., version: _Optional[str] = ..., features: _Optional[_Mapping[str, str]] = ..., last_seq: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("seq",)
    SEQ_FIELD_NUMBER: _ClassVar[int]
    seq: int
    def __init__(self, seq: _Optional[int] = ...) -> None: ...

class EventBatch(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ...) -> None: ...
