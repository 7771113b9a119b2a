"""The families of the GPUs' readings: the node's GPU counts, each GPU's hw_gpu_*, gpu_*
and lens_gpu_* series labelled with the pod the kubelet gave it, and the health counters
operators alert on. `add` (the collector's) makes a family at its first sample and leaves
a value the GPU does not report absent, never zero.
"""

from __future__ import annotations

from collections.abc import Callable

from lens_ebpf.agent.devices.gpu.model import GpuReading, flag

# add(name, help, labels, value, kind="gauge"): a sample, skipped when value is None
Add = Callable[..., None]


def gpu_families(
    add: Add,
    n: dict[str, str],
    gpus: list[GpuReading],
    owners: dict[int, dict[str, str]],
    identify: Callable[[int], dict[str, str]],
) -> None:
    """The node's GPU counts and each GPU's series (n: the node's labels; owners: by
    id(reading), the labels of the pod holding it; identify: a host pid's pod)."""
    add("hw_gpu_count", "GPUs on the node", n, len(gpus))
    add(
        "hw_gpu_used_count",
        "GPUs with utilization or memory in use",
        n,
        sum(1 for g in gpus if g.used),
    )
    types: dict[str, int] = {}
    for g in gpus:
        types[g.name or g.device_id] = types.get(g.name or g.device_id, 0) + 1
    for t, c in sorted(types.items()):
        add("hw_gpu_type_count", "GPUs per model", {**n, "gpu_type": t}, c)
    for g in gpus:
        lbl = {
            **n,
            "gpu_index": str(g.index),
            "gpu_name": g.name,
            "gpu_uuid": g.uuid or g.unique_id or g.serial or g.bdf,
            "vendor": g.vendor,
            **owners[id(g)],
        }
        add("hw_gpu_memory_total_bytes", "GPU memory", lbl, g.memory_total)
        add("hw_gpu_memory_used_bytes", "GPU memory used", lbl, g.memory_used)
        add("hw_gpu_memory_free_bytes", "GPU memory free", lbl, g.memory_free)
        add("hw_gpu_utilization_percent", "GPU busy", lbl, g.utilization)
        add("hw_gpu_temperature_celsius", "GPU temperature", lbl, g.temperature)
        add("hw_gpu_power_draw_watts", "GPU power draw", lbl, g.power_draw)
        add("hw_gpu_power_limit_watts", "GPU power limit", lbl, g.power_limit)
        for sensor, value in sorted(g.temperatures.items()):
            add(
                "lens_gpu_temperature_celsius",
                "GPU temperature by sensor",
                {**lbl, "sensor": sensor},
                value,
            )
        health_families(add, lbl, g)
        # vendor tells two GPUs 0 apart on a node with GPUs of both (the metric conventions)
        idx = {"gpu_index": str(g.index), "vendor": g.vendor, **owners[id(g)]}
        gid = {"gpu_id": str(g.index), "vendor": g.vendor, **owners[id(g)]}
        add("gpu_utilization", "GPU utilization percent", gid, g.utilization)
        add(
            "gpu_socket_power_watts",
            "GPU socket power (amdsmi's socket_power), watts",
            gid,
            g.power_socket,
        )
        add(
            "gpu_pcie_bandwidth_mbs",
            "PCIe bandwidth in use (amdsmi's), Mb/s",
            gid,
            g.pcie_bandwidth_mbs,
        )
        add("gpu_utilization_percent", "GPU busy", idx, g.utilization)
        add("gpu_memory_used_bytes", "GPU memory used", idx, g.memory_used)
        add("gpu_memory_total_bytes", "GPU memory", idx, g.memory_total)
        add("gpu_temperature_celsius", "GPU temperature", idx, g.temperature)
        add("gpu_power_draw_watts", "GPU power draw", idx, g.power_draw)
        for p in g.processes:
            who = identify(p.pid)
            add(
                "gpu_process_memory_bytes",
                "GPU memory per process (host pid)",
                {
                    **idx,
                    "pid": str(p.pid),
                    "namespace": who.get("namespace", ""),
                    "pod": who.get("pod", ""),
                    "container": who.get("container", ""),
                },
                p.memory_bytes,
            )


def health_families(add: Add, lbl: dict[str, str], g: GpuReading) -> None:
    """The faults operators alert on, each only where the GPU reports it."""
    for (etype, counter), n in sorted(g.ecc_errors.items()):
        add(
            "lens_gpu_ecc_errors_total",
            "Memory ECC errors: corrected or uncorrected, since "
            "the driver loaded (volatile) or over the GPU's life (aggregate)",
            {**lbl, "type": etype, "counter": counter},
            n,
            "counter",
        )
    for cause, n in sorted(g.retired_pages.items()):
        add("lens_gpu_retired_pages", "Memory pages retired, by cause", {**lbl, "cause": cause}, n)
    add(
        "lens_gpu_retired_pages_pending",
        "1 while a page retirement waits for a reset",
        lbl,
        flag(g.retired_pages_pending),
    )
    for kind, n in sorted(g.remapped_rows.items()):
        add(
            "lens_gpu_remapped_rows",
            "Memory rows remapped, by the error that caused it",
            {**lbl, "type": kind},
            n,
        )
    add(
        "lens_gpu_row_remap_pending",
        "1 while a row remapping waits for a reset",
        lbl,
        flag(g.row_remap_pending),
    )
    add(
        "lens_gpu_row_remap_failure",
        "1 when a row remapping has failed",
        lbl,
        flag(g.row_remap_failure),
    )
    if g.recovery_action is not None:
        add(
            "lens_gpu_reset_pending",
            "1 while the driver asks for a GPU reset (or more: "
            "a node reboot, a drain) before the GPU is usable again, as after an Xid 79 or "
            "95; the action is in the device inventory",
            lbl,
            float(g.recovery_action != "none"),
        )
    for reason, active in sorted(g.clock_events.items()):
        add(
            "lens_gpu_clock_event_active",
            "1 while this reason holds the clocks down " "(throttling)",
            {**lbl, "reason": reason},
            float(active),
        )
    for clock, mhz in sorted(g.clocks_mhz.items()):
        add("lens_gpu_clock_mhz", "Current clock", {**lbl, "clock": clock}, mhz)
    add("lens_gpu_pcie_replays_total", "PCIe replays", lbl, g.pcie_replays, "counter")
    for (block, kind), n in sorted(g.ras_errors.items()):
        add(
            "lens_gpu_ras_errors_total",
            "RAS errors by block (umc, gfx, sdma, ...) and type",
            {**lbl, "block": block, "type": kind},
            n,
            "counter",
        )
    add(
        "lens_gpu_energy_joules_total",
        "Energy the GPU used since the driver loaded",
        lbl,
        g.energy_joules,
        "counter",
    )
    for direction, bps in sorted(g.pcie_bytes_per_second.items()):
        add(
            "lens_gpu_pcie_throughput_bytes_per_second",
            "PCIe throughput (NVML's 20 ms " "sample)",
            {**lbl, "direction": direction},
            bps,
        )
    for link, up in sorted(g.nvlink_up.items()):
        add(
            "lens_gpu_nvlink_up",
            "1 while the NVLink is active",
            {**lbl, "link": str(link)},
            float(up),
        )
    totals: dict[str, int] = {}
    for (_, counter), n in g.nvlink_errors.items():  # per GPU, as dcgm-exporter's totals
        totals[counter] = totals.get(counter, 0) + n
    for counter, n in sorted(totals.items()):
        add(
            "lens_gpu_nvlink_errors_total",
            "NVLink data-link errors summed over the GPU's "
            "links, by counter (replay, recovery, crc_flit, crc_data, ecc_data)",
            {**lbl, "counter": counter},
            n,
            "counter",
        )
    add(
        "lens_gpu_xgmi_error_status",
        "AMD XGMI link errors: 0 none, 1 one, 2 several",
        lbl,
        g.xgmi_error_status,
    )
