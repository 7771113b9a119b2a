"""lens_rdma_port_* against node_exporter's infiniband collector, value for value.

node_exporter's semantics are written down here, apart from lens-ebpf's code: which
sysfs file feeds which node_infiniband_* series, and how (procfs's class_infiniband.go
and node_exporter's infiniband_linux.go). The same tree goes through both; every
node_exporter value must appear under the corresponding lens-ebpf name, equal. The one
documented difference: a counters/ value stuck at 2^32 - 1 (a saturated 32-bit PMA
counter) node_exporter reports as it is, lens-ebpf withholds and flags
(lens_rdma_port_counter_saturated).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lens_ebpf.agent.devices.rdma.collector import RdmaCollector

SYS = Path(__file__).parent.parent / "fixtures" / "rdma" / "sys"
SATURATED = 4294967295

# node_infiniband_<name>: (directory, file, multiplier), as node_exporter reads them
NODE_EXPORTER = {
    "port_data_transmitted_bytes_total": ("counters", "port_xmit_data", 4),
    "port_data_received_bytes_total": ("counters", "port_rcv_data", 4),
    "port_packets_transmitted_total": ("counters", "port_xmit_packets", 1),
    "port_packets_received_total": ("counters", "port_rcv_packets", 1),
    "unicast_packets_transmitted_total": ("counters", "unicast_xmit_packets", 1),
    "unicast_packets_received_total": ("counters", "unicast_rcv_packets", 1),
    "multicast_packets_transmitted_total": ("counters", "multicast_xmit_packets", 1),
    "multicast_packets_received_total": ("counters", "multicast_rcv_packets", 1),
    "port_errors_received_total": ("counters", "port_rcv_errors", 1),
    "port_discards_transmitted_total": ("counters", "port_xmit_discards", 1),
    "port_discards_received_total": ("counters", "port_rcv_discards", 1),
    "port_constraint_errors_transmitted_total": ("counters", "port_xmit_constraint_errors", 1),
    "port_constraint_errors_received_total": ("counters", "port_rcv_constraint_errors", 1),
    "port_transmit_wait_total": ("counters", "port_xmit_wait", 1),
    "symbol_error_total": ("counters", "symbol_error", 1),
    "link_downed_total": ("counters", "link_downed", 1),
    "link_error_recovery_total": ("counters", "link_error_recovery", 1),
    "local_link_integrity_errors_total": ("counters", "local_link_integrity_errors", 1),
    "excessive_buffer_overrun_errors_total": ("counters", "excessive_buffer_overrun_errors", 1),
    "vl15_dropped_total": ("counters", "VL15_dropped", 1),
    "port_receive_remote_physical_errors_total": ("counters", "port_rcv_remote_physical_errors", 1),
    "port_receive_switch_relay_errors_total": ("counters", "port_rcv_switch_relay_errors", 1),
    "legacy_data_transmitted_bytes_total": ("counters_ext", "port_xmit_data_64", 4),
    "legacy_data_received_bytes_total": ("counters_ext", "port_rcv_data_64", 4),
    "legacy_packets_transmitted_total": ("counters_ext", "port_xmit_packets_64", 1),
    "legacy_packets_received_total": ("counters_ext", "port_rcv_packets_64", 1),
    "legacy_unicast_packets_transmitted_total": ("counters_ext", "port_unicast_xmit_packets", 1),
    "legacy_unicast_packets_received_total": ("counters_ext", "port_unicast_rcv_packets", 1),
    "legacy_multicast_packets_transmitted_total": (
        "counters_ext",
        "port_multicast_xmit_packets",
        1,
    ),
    "legacy_multicast_packets_received_total": ("counters_ext", "port_multicast_rcv_packets", 1),
}
# node_infiniband_<name> -> lens_rdma_port_<name> (docs/agent/devices.md's table says the same)
LENS = {
    "port_data_transmitted_bytes_total": "transmit_bytes_total",
    "port_data_received_bytes_total": "receive_bytes_total",
    "port_packets_transmitted_total": "transmit_packets_total",
    "port_packets_received_total": "receive_packets_total",
    "unicast_packets_transmitted_total": "transmit_unicast_packets_total",
    "unicast_packets_received_total": "receive_unicast_packets_total",
    "multicast_packets_transmitted_total": "transmit_multicast_packets_total",
    "multicast_packets_received_total": "receive_multicast_packets_total",
    "port_errors_received_total": "receive_errors_total",
    "port_discards_transmitted_total": "transmit_discards_total",
    "port_discards_received_total": "receive_discards_total",
    "port_constraint_errors_transmitted_total": "transmit_constraint_errors_total",
    "port_constraint_errors_received_total": "receive_constraint_errors_total",
    "port_transmit_wait_total": "transmit_wait_total",
    "symbol_error_total": "symbol_errors_total",
    "link_downed_total": "link_downed_total",
    "link_error_recovery_total": "link_error_recovery_total",
    "local_link_integrity_errors_total": "local_link_integrity_errors_total",
    "excessive_buffer_overrun_errors_total": "excessive_buffer_overrun_errors_total",
    "vl15_dropped_total": "vl15_dropped_total",
    "port_receive_remote_physical_errors_total": "receive_remote_physical_errors_total",
    "port_receive_switch_relay_errors_total": "receive_switch_relay_errors_total",
    **{
        f"legacy_{k}": f"legacy_{v}"
        for k, v in {
            "data_transmitted_bytes_total": "transmit_bytes_total",
            "data_received_bytes_total": "receive_bytes_total",
            "packets_transmitted_total": "transmit_packets_total",
            "packets_received_total": "receive_packets_total",
            "unicast_packets_transmitted_total": "transmit_unicast_packets_total",
            "unicast_packets_received_total": "receive_unicast_packets_total",
            "multicast_packets_transmitted_total": "transmit_multicast_packets_total",
            "multicast_packets_received_total": "receive_multicast_packets_total",
        }.items()
    },
}
GAUGES = {
    "state_id": "state",
    "physical_state_id": "physical_state",
    "rate_bytes_per_second": "rate_bytes_per_second",
}


def node_exporter_values(sys: Path) -> dict[tuple[str, str, str], float]:
    """(node_infiniband_<name>, device, port) -> value, by node_exporter's rules."""
    out: dict[tuple[str, str, str], float] = {}
    for dev in sorted((sys / "class" / "infiniband").iterdir()):
        skip_counters = dev.name.startswith(("irdma", "nvs_"))
        for port in sorted((dev / "ports").iterdir()):
            key = (dev.name, port.name)
            state = (port / "state").read_text().split(":")[0]
            phys = (port / "phys_state").read_text().split(":")[0]
            out[("state_id", *key)] = int(state)
            out[("physical_state_id", *key)] = int(phys)
            gbps = float((port / "rate").read_text().split(" ", 1)[0])
            out[("rate_bytes_per_second", *key)] = int(gbps * 125000000)
            for name, (directory, file, mult) in NODE_EXPORTER.items():
                if skip_counters and directory == "counters":
                    continue
                path = port / directory / file
                try:
                    text = path.read_text().strip()
                except OSError:  # missing, unreadable (iWARP's EINVAL): skipped
                    continue
                if "N/A (no PMA)" in text:
                    continue
                out[(name, *key)] = int(text) * mult
    return out


def lens_values(sys: Path) -> dict[tuple[str, str, str], float]:
    c = RdmaCollector(5, sys, runner=None)
    c.run_once()
    assert c.success
    return {
        (s.name, s.labels["device"], s.labels["port"]): s.value
        for m in c.snapshot()
        for s in m.samples
        if s.name.startswith("lens_rdma_port_") and "counter" not in s.labels
    } | {
        (s.name, s.labels["device"], s.labels["port"], s.labels["counter"]): s.value  # type: ignore[misc]
        for m in c.snapshot()
        for s in m.samples
        if s.name == "lens_rdma_port_counter_saturated"
    }


def lens_name(ne_name: str) -> str:
    if ne_name in GAUGES:
        return f"lens_rdma_port_{GAUGES[ne_name]}"
    return f"lens_rdma_port_{LENS[ne_name]}"


def test_every_node_exporter_value_is_the_same_under_its_lens_name() -> None:
    ne = node_exporter_values(SYS)
    lens = lens_values(SYS)
    compared = withheld = 0
    for (name, dev, port), value in ne.items():
        directory, file, _ = NODE_EXPORTER.get(name, ("", "", 1))
        ours = lens.get((lens_name(name), dev, port))
        if directory == "counters" and value in (SATURATED, SATURATED * 4) and ours is None:
            # the documented difference: withheld, and flagged
            assert lens[("lens_rdma_port_counter_saturated", dev, port, file)] == 1
            withheld += 1
            continue
        assert ours == value, (name, dev, port, ours, value)
        compared += 1
    # the mlx4 ports alone give 2 x (3 gauges + 22 counters/ + 8 counters_ext/) series
    assert compared >= 66 and withheld == 4


@pytest.mark.parametrize(
    ("ne_name", "device", "port", "want"),
    [
        ("port_packets_received_total", "mlx4_0", "1", 6_825_908_347),  # counters/, not ext's 0
        ("legacy_packets_received_total", "mlx4_0", "1", 0),
        ("port_packets_received_total", "mlx4_0", "2", 0),  # counters/, not ext's 70
        ("legacy_packets_received_total", "mlx4_0", "2", 70),
        ("port_data_received_bytes_total", "mlx4_0", "1", 9_876_543_210 * 4),
        ("legacy_data_received_bytes_total", "rocep8s0f0", "1", 20_000_000_000 * 4),
        ("port_discards_received_total", "mlx4_0", "1", 17),
        ("port_constraint_errors_transmitted_total", "mlx4_0", "1", 4),
        ("port_constraint_errors_received_total", "mlx4_0", "1", 2),
        ("port_transmit_wait_total", "mlx4_0", "1", 123456),
        ("vl15_dropped_total", "mlx4_0", "1", 8),
        ("symbol_error_total", "mlx4_0", "1", 5),
        ("local_link_integrity_errors_total", "mlx4_0", "1", 6),
        ("excessive_buffer_overrun_errors_total", "mlx4_0", "1", 7),
        ("rate_bytes_per_second", "mlx4_0", "2", 7_000_000_000),
    ],
)
def test_hand_checked_values(ne_name: str, device: str, port: str, want: int) -> None:
    assert node_exporter_values(SYS)[(ne_name, device, port)] == want
    assert lens_values(SYS)[(lens_name(ne_name), device, port)] == want


def test_every_mapped_family_is_in_the_docs_table() -> None:
    page = (Path(__file__).parents[2] / "docs" / "agent" / "devices.md").read_text()
    for ne_name in NODE_EXPORTER:
        row = f"| `{lens_name(ne_name)}` | `node_infiniband_{ne_name}` |"
        assert row in page, row
