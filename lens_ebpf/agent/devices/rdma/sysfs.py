"""RDMA devices and ports from /sys/class/infiniband (any driver, any device name)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from lens_ebpf.agent.devices.files import read_text

SATURATED_32 = 4294967295
# counters/ and counters_ext/ files that count 4-byte words, not bytes
WORD_COUNTERS = {"port_xmit_data", "port_rcv_data", "port_xmit_data_64", "port_rcv_data_64"}


@dataclass
class RdmaPort:
    number: int
    state: int | None = None
    state_name: str = ""
    phys_state: int | None = None
    phys_state_name: str = ""
    rate_bytes: float | None = None
    rate_text: str = ""
    link_layer: str = ""
    port_guid: str = ""
    counters: dict[str, int] = field(default_factory=dict)  # counters/, as the files say
    # counters_ext/: mlx4's legacy duplicate (kernels before 4.5 kept 64-bit values
    # there); never mixed into counters, whatever either says
    legacy: dict[str, int] = field(default_factory=dict)
    hw_counters: dict[str, int] = field(default_factory=dict)
    saturated: list[str] = field(default_factory=list)  # counters/ stuck at 2^32 - 1


@dataclass
class RdmaDevice:
    name: str
    node_guid: str = ""
    sys_image_guid: str = ""
    node_type: str = ""
    fw_ver: str = ""
    hca_type: str = ""
    board_id: str = ""
    netdev: str = ""
    ports: list[RdmaPort] = field(default_factory=list)


def parse_state(text: str) -> tuple[int | None, str]:
    """'4: ACTIVE' -> (4, 'ACTIVE')."""
    num, _, name = text.strip().partition(":")
    try:
        return int(num), name.strip()
    except ValueError:
        return None, text.strip()


_RATE = re.compile(r"^\s*([\d.]+)\s*Gb/sec")


def parse_rate(text: str) -> float | None:
    """'200 Gb/sec (4X HDR)' -> bytes per second."""
    m = _RATE.match(text)
    return float(m.group(1)) * 1e9 / 8 if m else None


def parse_counter(text: str) -> int | None:
    """A counter file's value; None for 'N/A (no PMA)' and other non-numbers."""
    try:
        return int(text.strip(), 0)
    except ValueError:
        return None


def port_guid_from_gid(gid: str) -> str:
    """The port GUID is the interface id, the low 64 bits of GID 0."""
    parts = gid.strip().split(":")
    return ":".join(parts[4:8]) if len(parts) == 8 else ""


def _counters(directory: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    if not directory.is_dir():
        return out
    for f in sorted(directory.iterdir()):
        text = read_text(f)
        value = parse_counter(text) if text is not None else None
        if value is not None:
            out[f.name] = value
    return out


def read_port(path: Path) -> RdmaPort:
    port = RdmaPort(int(path.name))
    if (text := read_text(path / "state")) is not None:
        port.state, port.state_name = parse_state(text)
    if (text := read_text(path / "phys_state")) is not None:
        port.phys_state, port.phys_state_name = parse_state(text)
    if (text := read_text(path / "rate")) is not None:
        port.rate_text = text.strip()
        port.rate_bytes = parse_rate(text)
    port.link_layer = (read_text(path / "link_layer") or "").strip()
    port.port_guid = port_guid_from_gid(read_text(path / "gids" / "0") or "")
    # counters/ is the kernel's authoritative set (64-bit where the HCA has
    # PortCountersExtended); a 32-bit one stuck at its maximum counts nothing more
    for name, value in _counters(path / "counters").items():
        if value == SATURATED_32:
            port.saturated.append(name)
        else:
            port.counters[name] = value
    port.legacy = _counters(path / "counters_ext")
    port.hw_counters = _counters(path / "hw_counters")
    return port


def read_devices(sysfs: Path = Path("/sys")) -> list[RdmaDevice]:
    """Every RDMA device: directories under class/infiniband, whatever their names."""
    root = sysfs / "class" / "infiniband"
    if not root.is_dir():
        return []
    devices = []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        dev = RdmaDevice(d.name)
        for attr in ("node_guid", "sys_image_guid", "node_type", "fw_ver", "hca_type", "board_id"):
            setattr(dev, attr, (read_text(d / attr) or "").strip())
        dev.node_type = parse_state(dev.node_type)[1]  # "1: CA" -> CA, switch, router, RNIC
        net = d / "device" / "net"
        if net.is_dir():
            names = sorted(n.name for n in net.iterdir())
            dev.netdev = names[0] if names else ""
        ports = d / "ports"
        if ports.is_dir():
            dev.ports = [
                read_port(p)
                for p in sorted(ports.iterdir(), key=lambda p: p.name)
                if p.name.isdigit()
            ]
        devices.append(dev)
    return devices


def uverbs_map(sysfs: Path = Path("/sys")) -> dict[int, str]:
    """uverbs index -> RDMA device, for /dev/infiniband/uverbsN in containers."""
    root = sysfs / "class" / "infiniband_verbs"
    out: dict[int, str] = {}
    if not root.is_dir():
        return out
    for d in root.iterdir():
        m = re.fullmatch(r"uverbs(\d+)", d.name)
        ibdev = read_text(d / "ibdev")
        if m and ibdev:
            out[int(m.group(1))] = ibdev.strip()
    return out
