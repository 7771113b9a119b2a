"""device_change and device_inventory from the device collectors' reads: nothing when
nothing changed, one event per change with the full record and the fields that differ,
the inventory once every collector has read and again on each reporter (re)connect."""

import dataclasses
import shutil
from pathlib import Path

from lens_ebpf.agent.devices import inventory as records
from lens_ebpf.agent.devices.gpu import amd
from lens_ebpf.agent.devices.gpu.collector import GpuCollector
from lens_ebpf.agent.devices.rdma import sysfs as rdma_sysfs
from lens_ebpf.agent.events import DeviceChange, DeviceInventory
from lens_ebpf.agent.inventory import DeviceWatch

FIX = Path(__file__).parent.parent / "fixtures"
CARD1 = "devices/pci0000:c0/0000:c0:01.1/0000:c1:00.0"


def gpu_node(
    tmp_path: Path,
    allocated: dict | None = None,
) -> tuple[GpuCollector, DeviceWatch, list]:
    sys = tmp_path / "sys"
    shutil.copytree(FIX / "gpu" / "sys", sys, symlinks=True)
    got: list = []
    watch = DeviceWatch(got.append)
    watch.expect("gpu")
    c = GpuCollector(
        5,
        "gpu-7",
        {"amd": [("sysfs", lambda: amd.read_sysfs(sys))]},
        sysfs=sys,
        allocated=lambda: allocated or {},
    )
    c.on_readings = lambda gpus, holders: watch.update(
        "gpu", records.gpu_records(gpus, "gpu-7", holders)
    )
    return c, watch, got


def test_inventory_at_start_then_only_changes(tmp_path: Path) -> None:
    c, watch, got = gpu_node(tmp_path)
    c.run_once()
    (inv,) = got
    assert isinstance(inv, DeviceInventory)
    assert [(d.bdf, d.key, d.serial, d.model, d.vbios_version) for d in inv.devices] == [
        ("0000:c1:00.0", "0x18a96c02d4e1c0a3", "", "AMD Instinct MI300X", "113-M3000100-102"),
        ("0001:03:00.0", "gpu-7/0001:03:00.0", "", "", ""),
    ]
    c.run_once()
    c.run_once()
    assert len(got) == 1  # nothing changed: nothing sent
    # a board with a serial number now sits in slot c1 (and its VBIOS was flashed)
    card = tmp_path / "sys" / CARD1
    (card / "serial_number").write_text("692251001234\n")
    (card / "vbios_version").write_text("113-M3000100-103\n")
    c.run_once()
    (change,) = got[1:]
    assert isinstance(change, DeviceChange) and change.change == "changed"
    assert change.fields == ("serial", "vbios_version")  # the key is the unique_id: same
    assert (change.bdf, change.serial, change.vbios_version) == (
        "0000:c1:00.0",
        "692251001234",
        "113-M3000100-103",
    )
    assert watch.changes == 1


def test_the_pod_the_kubelet_gave_a_gpu_is_its_holder(tmp_path: Path) -> None:
    """The kubelet's allocation (PodResources, keyed by the device plugin's ID: a BDF for
    AMD) names the holder; a new holder is a change of that field, each way."""
    from lens_ebpf.agent.pods.podresources import DeviceOwner

    allocated: dict = {}
    c, _, got = gpu_node(tmp_path, allocated)
    c.run_once()
    assert [d.holder for d in got[0].devices] == ["", ""]
    allocated["0000:c1:00.0"] = DeviceOwner("amd.com/gpu", "ml", "llm-0", "main")
    c.run_once()
    c.run_once()
    allocated.clear()
    c.run_once()
    assert [(e.bdf, e.fields, e.holder) for e in got[1:]] == [
        ("0000:c1:00.0", ("holder",), "ml/llm-0"),
        ("0000:c1:00.0", ("holder",), ""),
    ]


def test_appeared_and_disappeared_with_the_full_record(tmp_path: Path) -> None:
    c, _, got = gpu_node(tmp_path)
    c.run_once()
    card = tmp_path / "sys" / "class" / "drm" / "card2"
    moved = tmp_path / "card2-away"
    card.rename(moved)  # the driver let go of the second GPU
    c.run_once()
    assert [(e.change, e.bdf, e.key) for e in got[1:]] == [
        ("disappeared", "0001:03:00.0", "gpu-7/0001:03:00.0")
    ]
    moved.rename(card)
    c.run_once()
    assert [(e.change, e.bdf) for e in got[2:]] == [("appeared", "0001:03:00.0")]


def test_inventory_waits_for_every_collector_and_comes_again_on_reconnect(tmp_path) -> None:
    got: list = []
    watch = DeviceWatch(got.append)
    watch.expect("gpu")
    watch.expect("rdma")
    watch.inventory_again()  # the reporter connected before any read: nothing yet
    watch.update("gpu", {})
    assert got == []
    ports = records.rdma_records(rdma_sysfs.read_devices(FIX / "rdma" / "sys"), "n1")
    watch.update("rdma", ports)
    (inv,) = got
    assert [
        (d.key, d.model, d.firmware_version, d.port_state, d.link_layer, d.rate)
        for d in inv.devices
    ] == [
        ("3cfd:fe9f:0033:0000/1", "", "1.57", "ACTIVE", "Ethernet", "25 Gb/sec (1X EDR)"),
        (
            "0002:c903:0042:9e10/1",
            "MT4099",
            "2.42.5000",
            "ACTIVE",
            "InfiniBand",
            "40 Gb/sec (4X QDR)",
        ),
        (
            "0002:c903:0042:9e10/2",
            "MT4099",
            "2.42.5000",
            "ACTIVE",
            "InfiniBand",
            "56 Gb/sec (4X FDR)",
        ),
        (
            "0c42:a103:0065:2a3c/1",
            "MT4123",
            "20.31.1014",
            "ACTIVE",
            "InfiniBand",
            "200 Gb/sec (4X HDR)",
        ),
        (
            "0c42:a103:0065:2a3d/1",
            "MT4123",
            "20.31.1014",
            "DOWN",
            "InfiniBand",
            "10 Gb/sec (4X SDR)",
        ),
        (
            "b859:9f03:00d4:e2f0/1",
            "MT4125",
            "22.36.1010",
            "ACTIVE",
            "Ethernet",
            "100 Gb/sec (4X EDR)",
        ),
    ]
    watch.inventory_again()
    assert len(got) == 2 and got[1].devices == inv.devices
    # a port goes down: one change naming the state
    slot = "mlx5_0/1"
    down = {**ports, slot: dataclasses.replace(ports[slot], port_state="DOWN")}
    watch.update("rdma", down)
    assert [(e.change, e.fields, e.port_state) for e in got[2:]] == [
        ("changed", ("port_state",), "DOWN")
    ]


def test_reporter_kinds_chooses_what_it_pushes(tmp_path: Path) -> None:
    """reporter.kinds: only those kinds reach the reporter's buffer (gaps always do); an
    unknown kind is a config error naming it."""
    from lens_ebpf.agent import config
    from lens_ebpf.agent.events import EventBus, Gap, NodeTuned
    from lens_ebpf.agent.stream.reporter import Reporter
    from lens_ebpf.core.settings import ConfigError
    from tests.agentproc import free_port
    from tests.conftest import wait_for

    bus = EventBus(100)
    rep = Reporter(
        f"127.0.0.1:{free_port()}",
        bus,
        ("n1", ""),
        100,
        backoff_max=60,
        kinds=frozenset({"device_change", "device_inventory"}),
    )
    rep.start()
    try:
        watch = DeviceWatch(bus.publish)
        watch.update("gpu", {})  # the inventory (nothing expected but this scope)
        bus.publish(NodeTuned(setting="vm.max_map_count", old_value=1, new_value=2))
        bus.publish(Gap(lost=3, reason="test"))
        wait_for(lambda: len(rep.pending) == 2, lambda: f"two events ({list(rep.pending)})")
        assert [e.kind for e in rep.pending] == ["device_inventory", "gap"]
    finally:
        rep.stop()
    cfg = tmp_path / "c.yaml"
    cfg.write_text("reporter:\n  kinds: [device_change, no_such_kind]\n")
    try:
        config.load(cfg, env={})
    except ConfigError as exc:
        assert "reporter.kinds" in str(exc) and "no_such_kind" in str(exc)
    else:
        raise AssertionError("an unknown kind was accepted")
