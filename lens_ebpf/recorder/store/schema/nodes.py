"""The nodes: the node agents' events, their devices (GPUs, RDMA ports) and what changed
on them, and the nodes as the API serves them."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Index,
    Integer,
    String,
    Table,
    UniqueConstraint,
)

from lens_ebpf.recorder.store.schema.meta import NAME, UID, metadata

# the node agents' events, as the reporters deliver them; (node, instance, seq) once: seq is
# numbered by each agent process (instance: its EventBus.instance; "" from an agent older
# than that), so a node's events are in order by at, then id, not by seq
node_events = Table(
    "node_events",
    metadata,
    Column("cluster", String(NAME), nullable=False),
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("node", String(NAME), nullable=False),
    Column("instance", String(64), nullable=False, default="", server_default=""),
    Column("seq", BigInteger, nullable=True),  # none for a gap
    Column("at", DateTime(timezone=True), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("namespace", String(NAME), nullable=False, default=""),
    Column("pod", String(NAME), nullable=False, default=""),
    Column("pod_uid", String(UID), nullable=False, default="", index=True),
    Column("container", String(NAME), nullable=False, default=""),
    Column("payload", JSON, nullable=False),
    UniqueConstraint("cluster", "node", "instance", "seq", name="uq_node_events_seq"),
)

# every node's GPUs and RDMA ports as its agent last reported them (device_change,
# device_inventory); one row per place a device sits (a GPU's BDF, an RDMA device/port),
# kept when it goes (present false)
node_devices = Table(
    "node_devices",
    metadata,
    Column("cluster", String(NAME), nullable=False),
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("node", String(NAME), nullable=False),
    Column("kind", String(16), nullable=False),  # gpu, rdma_port
    Column("slot", String(NAME), nullable=False),
    Column("key", String(NAME), nullable=False, index=True),  # UUID, unique id, serial, ...
    Column("idx", Integer, nullable=False, default=0),
    Column("vendor", String(32), nullable=False, default=""),
    Column("model", String(NAME), nullable=False, default=""),
    Column("uuid", String(NAME), nullable=False, default=""),
    Column("serial", String(NAME), nullable=False, default="", index=True),
    Column("bdf", String(32), nullable=False, default=""),
    Column("driver_version", String(64), nullable=False, default=""),
    Column("firmware_version", String(64), nullable=False, default=""),
    Column("vbios_version", String(64), nullable=False, default=""),
    Column("port_state", String(32), nullable=False, default=""),
    Column("link_layer", String(32), nullable=False, default=""),
    Column("rate", String(64), nullable=False, default=""),
    Column("retired_pages_pending", Boolean, nullable=False, default=False),
    Column("row_remap_pending", Boolean, nullable=False, default=False),
    Column("row_remap_failure", Boolean, nullable=False, default=False),
    Column("recovery_action", String(32), nullable=False, default=""),
    Column("holder", String(NAME), nullable=False, default=""),  # namespace/pod
    Column("present", Boolean, nullable=False, default=True),
    Column("first_seen", DateTime(timezone=True), nullable=False),
    Column("last_seen", DateTime(timezone=True), nullable=False),
    UniqueConstraint("cluster", "node", "kind", "slot", name="uq_node_devices_slot"),
)

# one row per field of a device that changed: serial, firmware, port state, health, ...
# ("present" when it appeared or went)
device_changelog = Table(
    "device_changelog",
    metadata,
    Column("cluster", String(NAME), nullable=False),
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("node", String(NAME), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("slot", String(NAME), nullable=False),
    Column("device_key", String(NAME), nullable=False, index=True),
    Column("field", String(32), nullable=False),
    Column("old_value", String(NAME), nullable=False, default=""),
    Column("new_value", String(NAME), nullable=False, default=""),
)
Index(
    "ix_device_changelog_node_at",
    device_changelog.c.cluster,
    device_changelog.c.node,
    device_changelog.c.at,
)

# the cluster's nodes as the API serves them (a Node watch): what the node pages show
nodes = Table(
    "nodes",
    metadata,
    Column("cluster", String(NAME), primary_key=True),
    Column("name", String(NAME), primary_key=True),
    Column("address", String(64), nullable=False, default=""),  # InternalIP
    Column("status", String(16), nullable=False, default=""),  # Ready, NotReady, Unknown
    Column("gpu_capacity", JSON, nullable=False),  # {"amd.com/gpu": 8}, configured resources
    Column("gpu_allocatable", JSON, nullable=False),
    Column("labels", JSON, nullable=False),  # the ones that matter: GPU product, type, zone
    Column("cpu_count", Integer, nullable=False, default=0),
    Column("memory_bytes", BigInteger, nullable=False, default=0),
    Column("memory", String(64), nullable=False, default=""),  # the capacity as served
    Column("kernel", String(NAME), nullable=False, default=""),
    Column("os_image", String(NAME), nullable=False, default=""),
    Column("kubelet_version", String(64), nullable=False, default=""),
    Column("container_runtime", String(NAME), nullable=False, default=""),
    Column("taints", Integer, nullable=False, default=0),  # how many (a tainted node is faulty)
    Column("deleted", Boolean, nullable=False, default=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)
