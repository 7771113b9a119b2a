"""The RDMA ports' families: what sysfs says of each device and port (identity, state,
link rate, the counters/, counters_ext/ and hw_counters/ files, with node_exporter's
word scaling) and `rdma statistic`'s counters, one rdma_stat_<counter> family each."""

from __future__ import annotations

from prometheus_client.core import Metric

from lens_ebpf.agent.devices.rdma import statistic, sysfs
from lens_ebpf.core.exposition import Family, family, gauge

ACTIVE = 4
# counters/ file -> (lens_rdma_port_<family>, node_exporter's node_infiniband_<name>, help).
# Values are node_exporter's for the same file: data words x 4, everything else as is.
NAMED = {
    "port_xmit_data": (
        "transmit_bytes_total",
        "port_data_transmitted_bytes_total",
        "Bytes sent (4-byte words x 4)",
    ),
    "port_rcv_data": (
        "receive_bytes_total",
        "port_data_received_bytes_total",
        "Bytes received (4-byte words x 4)",
    ),
    "port_xmit_packets": (
        "transmit_packets_total",
        "port_packets_transmitted_total",
        "Packets sent on all VLs (including errors)",
    ),
    "port_rcv_packets": (
        "receive_packets_total",
        "port_packets_received_total",
        "Packets received on all VLs (including errors)",
    ),
    "unicast_xmit_packets": (
        "transmit_unicast_packets_total",
        "unicast_packets_transmitted_total",
        "Unicast packets sent",
    ),
    "unicast_rcv_packets": (
        "receive_unicast_packets_total",
        "unicast_packets_received_total",
        "Unicast packets received",
    ),
    "multicast_xmit_packets": (
        "transmit_multicast_packets_total",
        "multicast_packets_transmitted_total",
        "Multicast packets sent",
    ),
    "multicast_rcv_packets": (
        "receive_multicast_packets_total",
        "multicast_packets_received_total",
        "Multicast packets received",
    ),
    "port_rcv_errors": (
        "receive_errors_total",
        "port_errors_received_total",
        "Packets received with errors",
    ),
    "port_xmit_discards": (
        "transmit_discards_total",
        "port_discards_transmitted_total",
        "Outbound packets discarded (port down or congested)",
    ),
    "port_rcv_discards": (
        "receive_discards_total",
        "port_discards_received_total",
        "Inbound packets discarded (port down or congested)",
    ),
    "port_xmit_constraint_errors": (
        "transmit_constraint_errors_total",
        "port_constraint_errors_transmitted_total",
        "Packets not sent for a switch port's constraints",
    ),
    "port_rcv_constraint_errors": (
        "receive_constraint_errors_total",
        "port_constraint_errors_received_total",
        "Packets received and discarded for the port's constraints",
    ),
    "port_xmit_wait": (
        "transmit_wait_total",
        "port_transmit_wait_total",
        "Ticks the port had data to send but sent none",
    ),
    "symbol_error": (
        "symbol_errors_total",
        "symbol_error_total",
        "Minor link errors on one or more physical lanes",
    ),
    "link_downed": (
        "link_downed_total",
        "link_downed_total",
        "Times the link failed to recover from an error and went down",
    ),
    "link_error_recovery": (
        "link_error_recovery_total",
        "link_error_recovery_total",
        "Times the link recovered from an error",
    ),
    "local_link_integrity_errors": (
        "local_link_integrity_errors_total",
        "local_link_integrity_errors_total",
        "Times local physical errors passed their threshold",
    ),
    "excessive_buffer_overrun_errors": (
        "excessive_buffer_overrun_errors_total",
        "excessive_buffer_overrun_errors_total",
        "Flow-control update periods with buffer overruns",
    ),
    "VL15_dropped": (
        "vl15_dropped_total",
        "vl15_dropped_total",
        "VL15 packets dropped for lack of resources",
    ),
    "port_rcv_remote_physical_errors": (
        "receive_remote_physical_errors_total",
        "port_receive_remote_physical_errors_total",
        "Packets received with the EBP delimiter",
    ),
    "port_rcv_switch_relay_errors": (
        "receive_switch_relay_errors_total",
        "port_receive_switch_relay_errors_total",
        "Packets a switch could not forward",
    ),
}
# counters_ext/ file (mlx4's legacy duplicate) -> lens_rdma_port_legacy_<family>, the
# node_exporter name, help. Exported beside the counters/ families, never into them.
LEGACY = {
    "port_xmit_data_64": (
        "transmit_bytes_total",
        "legacy_data_transmitted_bytes_total",
        "Bytes sent, counters_ext (4-byte words x 4)",
    ),
    "port_rcv_data_64": (
        "receive_bytes_total",
        "legacy_data_received_bytes_total",
        "Bytes received, counters_ext (4-byte words x 4)",
    ),
    "port_xmit_packets_64": (
        "transmit_packets_total",
        "legacy_packets_transmitted_total",
        "Packets sent, counters_ext",
    ),
    "port_rcv_packets_64": (
        "receive_packets_total",
        "legacy_packets_received_total",
        "Packets received, counters_ext",
    ),
    "port_unicast_xmit_packets": (
        "transmit_unicast_packets_total",
        "legacy_unicast_packets_transmitted_total",
        "Unicast packets sent, counters_ext",
    ),
    "port_unicast_rcv_packets": (
        "receive_unicast_packets_total",
        "legacy_unicast_packets_received_total",
        "Unicast packets received, counters_ext",
    ),
    "port_multicast_xmit_packets": (
        "transmit_multicast_packets_total",
        "legacy_multicast_packets_transmitted_total",
        "Multicast packets sent, counters_ext",
    ),
    "port_multicast_rcv_packets": (
        "receive_multicast_packets_total",
        "legacy_multicast_packets_received_total",
        "Multicast packets received, counters_ext",
    ),
}


def _family(name: str, help_text: str, kind: str = "gauge") -> Family:
    base = name.removesuffix("_total") if kind == "counter" else name
    return family(base, help_text, kind)


def device_metrics(devices: list[sysfs.RdmaDevice]) -> list[Metric]:
    """Metric families for what sysfs says about each device and port."""
    info = _family("lens_rdma_device_info", "RDMA device identity (value 1)")
    port_info = _family("lens_rdma_port_info", "RDMA port state and link (value 1)")
    state = _family("lens_rdma_port_state", "Port state (4: ACTIVE)")
    phys = _family("lens_rdma_port_physical_state", "Physical state (5: LinkUp)")
    up = _family("lens_rdma_port_up", "1 when the port is ACTIVE")
    rate = _family("lens_rdma_port_rate_bytes_per_second", "Link rate")
    sat = _family(
        "lens_rdma_port_counter_saturated",
        "1: a legacy 32-bit counter is stuck at 4294967295 (not exported)",
    )
    named = {c: _family(f"lens_rdma_port_{n}", h, "counter") for c, (n, _, h) in NAMED.items()}
    legacy = {
        c: _family(f"lens_rdma_port_legacy_{n}", h, "counter") for c, (n, _, h) in LEGACY.items()
    }
    other = _family("lens_rdma_port_counter_total", "Other counters/ values", "counter")
    other_legacy = _family(
        "lens_rdma_port_legacy_counter_total", "Other counters_ext/ values", "counter"
    )
    hw = _family("lens_rdma_port_hw_counter_total", "hw_counters/ values", "counter")
    for d in devices:
        info.add(
            {
                "device": d.name,
                "node_guid": d.node_guid,
                "sys_image_guid": d.sys_image_guid,
                "node_type": d.node_type,
                "fw_ver": d.fw_ver,
                "hca_type": d.hca_type,
                "board_id": d.board_id,
                "netdev": d.netdev,
            },
            1,
        )
        for p in d.ports:
            lbl = {"device": d.name, "port": str(p.number)}
            port_info.add(
                {
                    **lbl,
                    "state": p.state_name,
                    "phys_state": p.phys_state_name,
                    "link_layer": p.link_layer,
                    "rate": p.rate_text,
                },
                1,
            )
            if p.state is not None:
                state.add(lbl, p.state)
                up.add(lbl, 1 if p.state == ACTIVE else 0)
            if p.phys_state is not None:
                phys.add(lbl, p.phys_state)
            if p.rate_bytes is not None:
                rate.add(lbl, p.rate_bytes)
            for name in p.saturated:
                sat.add({**lbl, "counter": name}, 1)
            for values, families, rest in (
                (p.counters, named, other),
                (p.legacy, legacy, other_legacy),
            ):
                for name, value in values.items():
                    if name in sysfs.WORD_COUNTERS:
                        value *= 4
                    fam = families.get(name)
                    if fam is not None:
                        fam.add(lbl, value)
                    else:
                        rest.add({**lbl, "counter": name}, value)
            for name, value in p.hw_counters.items():
                hw.add({**lbl, "counter": name}, value)
    fams = [
        info,
        port_info,
        state,
        phys,
        up,
        rate,
        sat,
        *named.values(),
        other,
        *legacy.values(),
        other_legacy,
        hw,
    ]
    return [f for f in fams if f.samples]


def stat_metrics(stats: list[statistic.PortStats]) -> list[Metric]:
    """rdma_stat_<counter>{device,port}: one family per counter, created on first sight."""
    fams: dict[str, Family] = {}
    for s in stats:
        for name, value in s.counters.items():
            fam = fams.get(name)
            if fam is None:
                fam = fams[name] = gauge(f"rdma_stat_{name}", f"rdma statistic {name}")
            fam.add({"device": s.device, "port": str(s.port)}, value)
    return list(fams.values())
