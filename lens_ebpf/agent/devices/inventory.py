"""The node's devices as the records device_change and device_inventory carry
(lens_ebpf/agent/inventory.py diffs them).

Devices are matched between reads by where they sit (a GPU's PCI slot, an RDMA device's
port), so a board swapped in a slot is one record whose serial changed; each record's
`key` names the device itself (UUID, else the chip's unique id, else serial, else node +
BDF).
"""

from __future__ import annotations

from collections.abc import Iterable

from lens_ebpf.agent.devices.gpu.model import GpuReading
from lens_ebpf.agent.devices.rdma.sysfs import RdmaDevice
from lens_ebpf.agent.events import DeviceChange


def gpu_records(
    gpus: Iterable[GpuReading],
    node: str,
    holders: dict[str, dict[str, str]] | None = None,
) -> dict[str, DeviceChange]:
    """slot (BDF) -> the GPU's record; holders: BDF -> the labels (namespace, pod) of the
    pod the kubelet gave the GPU, which the record names as namespace/pod."""
    holders = holders or {}
    return {
        g.bdf: DeviceChange(
            change="",
            device_kind="gpu",
            vendor=g.vendor,
            bdf=g.bdf,
            slot=g.bdf,
            index=g.index,
            key=g.uuid or g.unique_id or g.serial or f"{node}/{g.bdf}",
            model=g.name,
            uuid=g.uuid,
            serial=g.serial,
            driver_version=g.driver_version,
            vbios_version=g.vbios_version,
            retired_pages_pending=bool(g.retired_pages_pending),
            row_remap_pending=bool(g.row_remap_pending),
            row_remap_failure=bool(g.row_remap_failure),
            recovery_action=g.recovery_action or "",
            holder=_holder(holders.get(g.bdf, {})),
        )
        for g in gpus
    }


def _holder(labels: dict[str, str]) -> str:
    return f"{labels['namespace']}/{labels['pod']}" if labels.get("pod") else ""


def rdma_records(devices: Iterable[RdmaDevice], node: str) -> dict[str, DeviceChange]:
    """slot (device/port) -> the port's record."""
    return {
        f"{d.name}/{p.number}": DeviceChange(
            change="",
            device_kind="rdma_port",
            vendor="",
            bdf="",
            slot=f"{d.name}/{p.number}",
            index=p.number,
            key=f"{d.node_guid or node + '/' + d.name}/{p.number}",
            model=d.hca_type or d.board_id,
            firmware_version=d.fw_ver,
            port_state=p.state_name,
            link_layer=p.link_layer,
            rate=p.rate_text,
        )
        for d in devices
        for p in d.ports
    }
