"""The nodes' devices in the recorder: an agent's device_inventory and device_change
(from its real collectors' records) become node_devices rows and one changelog row per
field that changed; replaying the same inventory writes nothing; the routes answer in the
Primus-Lens envelope, under /v1/ and /api/, with the documented errors."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import requests

from lens_ebpf.agent.devices import inventory as records
from lens_ebpf.agent.devices.gpu import amd
from lens_ebpf.agent.events import GpuFault
from lens_ebpf.agent.inventory import DeviceWatch
from tests import pglab
from tests.conftest import hang_guard
from tests.k8slab import FakeApiServer, eventually
from tests.recorder.conftest import example, rows
from tests.recorder.test_node_events import reporting

FIX = Path(__file__).parent.parent / "fixtures"
CARD1 = "devices/pci0000:c0/0000:c0:01.1/0000:c1:00.0"


def xid(code: str, pod: str) -> GpuFault:
    return GpuFault(
        gpu_index=0,
        bdf="0000:c1:00.0",
        uuid="",
        vendor="amd",
        fault="xid",
        code=code,
        message=f"Xid {code}",
        pod=pod,
        namespace="ml",
        workload=pod.split("-")[0],
    )


def get(app: Any, path: str) -> requests.Response:
    r = requests.get(f"http://127.0.0.1:{app.http.port}{path}", timeout=hang_guard(5))
    example(path, r.json())
    return r


def changes(url: str) -> list[tuple[str, str, str, str, str]]:
    return [
        (r["node"], r["slot"], r["field"], r["old_value"], r["new_value"])
        for r in rows(url, "device_changelog")
    ]


def test_inventory_then_a_serial_change(
    api: FakeApiServer, recorder_app: Any, db_url: str, tmp_path: Path
) -> None:
    sys = tmp_path / "sys"
    shutil.copytree(FIX / "gpu" / "sys", sys, symlinks=True)
    app = recorder_app(db_url)
    with reporting(app) as (bus, reporter):  # node gpu-1
        watch = DeviceWatch(bus.publish)
        watch.expect("gpu")

        def read() -> None:
            watch.update("gpu", records.gpu_records(amd.read_sysfs(sys), "gpu-1"))

        read()  # the inventory: two GPUs
        eventually(lambda: reporter.acked == 1, timeout=15)
        assert app.writer.flush(10)
        assert changes(db_url) == [
            ("gpu-1", "0000:c1:00.0", "present", "", "true"),
            ("gpu-1", "0001:03:00.0", "present", "", "true"),
        ]
        bus.publish(xid("79", "old-board-job"))  # a fault of the board that was there
        (sys / CARD1 / "serial_number").write_text("692251001234\n")
        read()  # one device_change
        watch.inventory_again()  # the reporter reconnected: the same inventory again
        bus.publish(xid("48", "llm-0"))  # and one of the new board
        eventually(lambda: reporter.acked == 5, timeout=15)
        assert app.writer.flush(10)
    assert changes(db_url)[2:] == [("gpu-1", "0000:c1:00.0", "serial", "", "692251001234")]
    devices = {r["slot"]: r for r in rows(db_url, "node_devices")}
    assert devices["0000:c1:00.0"]["serial"] == "692251001234"
    assert devices["0000:c1:00.0"]["key"] == "0x18a96c02d4e1c0a3"  # the chip: the same one

    for prefix in ("/v1", "/api"):
        r = get(app, f"{prefix}/nodes/gpu-1/devices/changelog?page_num=1&page_size=2")
        body = r.json()
        assert r.status_code == 200 and body["meta"] == {"code": 2000, "message": "OK"}
        assert body["data"]["total"] == 3
        assert [(c["slot"], c["field"], c["old"], c["new"]) for c in body["data"]["data"]] == [
            ("0000:c1:00.0", "present", "", "true"),
            ("0001:03:00.0", "present", "", "true"),
        ]
        page2 = get(app, f"{prefix}/nodes/gpu-1/devices/changelog?pageNum=2&pageSize=2").json()
        assert [(c["field"], c["new"]) for c in page2["data"]["data"]] == [
            ("serial", "692251001234")
        ]
    later = get(app, "/v1/nodes/gpu-1/devices/changelog?since=4102444800").json()  # 2100
    assert later["data"] == {"data": [], "total": 0}
    devs = get(app, "/v1/nodes/gpu-1/devices").json()["data"]
    assert [(d["slot"], d["serial"], d["model"], d["present"]) for d in devs["devices"]] == [
        ("0000:c1:00.0", "692251001234", "AMD Instinct MI300X", True),
        ("0001:03:00.0", "", "", True),
    ]
    hist = get(app, "/v1/devices/692251001234/history").json()["data"]
    assert [(p["slot"], p["key"]) for p in hist["places"]] == [
        ("0000:c1:00.0", "0x18a96c02d4e1c0a3")
    ]
    assert [(c["field"], c["new"]) for c in hist["changes"]] == [
        ("present", "true"),
        ("serial", "692251001234"),
    ]
    # the faults on this board, with the pod that held it: not the old board's
    assert [(f["code"], f["namespace"], f["pod"], f["workload"]) for f in hist["faults"]] == [
        ("48", "ml", "llm-0", "llm")
    ]


def test_an_inventory_without_a_device_marks_it_gone(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    app = recorder_app(db_url)
    both = records.gpu_records(amd.read_sysfs(FIX / "gpu" / "sys"), "gpu-1")
    with reporting(app) as (bus, reporter):
        first = DeviceWatch(bus.publish)
        first.update("gpu", both)
        # the agent restarted with one GPU fewer (its driver let go while it was down)
        second = DeviceWatch(bus.publish)
        second.update("gpu", {k: v for k, v in both.items() if k == "0000:c1:00.0"})
        eventually(lambda: reporter.acked == 2, timeout=15)
        assert app.writer.flush(10)
    assert changes(db_url)[2:] == [("gpu-1", "0001:03:00.0", "present", "true", "false")]
    gone = {r["slot"]: r["present"] for r in rows(db_url, "node_devices")}
    assert gone == {"0000:c1:00.0": True, "0001:03:00.0": False}


@pytest.mark.parametrize(
    "path, status, code, names",
    [
        ("/v1/nodes/gpu-1/devices/changelog?page_size=1001", 400, 4001, "page_size"),
        ("/v1/nodes/gpu-1/devices/changelog?pageNum=0", 400, 4001, "page_num"),
        ("/v1/nodes/gpu-1/devices/changelog?page_num=x", 400, 4001, "page_num"),
        ("/v1/nodes/gpu-1/devices/changelog?since=yesterday", 400, 4001, "since"),
        ("/v1/nodes/nowhere/devices", 404, 4004, "nowhere"),
        ("/v1/nodes/nowhere/devices/changelog", 404, 4004, "nowhere"),
        ("/api/devices/NOPE/history", 404, 4004, "NOPE"),
        ("/v1/no/such/route", 404, 4004, "no/such/route"),
    ],
)
def test_bad_requests_get_the_documented_answers(
    api: FakeApiServer,
    recorder_app: Any,
    tmp_path: Path,
    path: str,
    status: int,
    code: int,
    names: str,
) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    app = recorder_app(url)
    with reporting(app) as (bus, reporter):
        DeviceWatch(bus.publish).update(
            "gpu", records.gpu_records(amd.read_sysfs(FIX / "gpu" / "sys"), "gpu-1")
        )
        eventually(lambda: reporter.acked == 1, timeout=15)
        assert app.writer.flush(10)
    r = get(app, path)
    body = r.json()
    assert r.status_code == status and body["meta"]["code"] == code and body["data"] is None
    assert names in body["meta"]["message"]


def test_database_down_is_5003(
    api: FakeApiServer, recorder_app: Any, postgres: pglab.Postgres
) -> None:
    url = postgres.create_database("devices_down")
    app = recorder_app(url)
    postgres.stop()
    try:
        r = get(app, "/v1/nodes/gpu-1/devices")
        body = r.json()
        assert r.status_code == 503 and body["meta"]["code"] == 5003
        assert "database unavailable" in body["meta"]["message"]
    finally:
        postgres.start()


def test_a_real_agent_reports_a_gpu_that_changed_serial(
    api: FakeApiServer, recorder_app: Any, tmp_path: Path
) -> None:
    """End to end: a running agent (GPU collector on a fixture sysfs, its reporter aimed at
    the service); a GPU's serial changes in the tree; one changelog row with old and new,
    and the node's devices show the new serial."""
    from tests.agentproc import AgentProc

    sys = tmp_path / "sys"
    shutil.copytree(FIX / "gpu" / "sys", sys, symlinks=True)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    app = recorder_app(url)
    env = {
        "NODE_NAME": "gpu-node-3",
        "LENS_DEVICES__SYSFS_ROOT": str(sys),
        "LENS_COLLECTORS__GPU__INTERVAL_SECONDS": "1",
        "LENS_COLLECTORS__GPU__NVIDIA_SMI": "lens-no-such-tool",
        "LENS_COLLECTORS__GPU__AMD_SMI": "lens-no-such-tool",
        "LENS_COLLECTORS__RDMA__TOOL": "lens-no-such-rdma-tool",
        "LENS_REPORTER__TARGET": f"127.0.0.1:{app.collect_port}",
        "LENS_REPORTER__KINDS": "[device_change, device_inventory]",
    }
    agent = AgentProc("--no-collector.tcp", "--no-collector.processes", env=env)
    try:
        agent.wait_ready()

        def present() -> list[tuple[str, str]]:
            return sorted((r["slot"], r["serial"]) for r in rows(url, "node_devices"))

        eventually(lambda: present() == [("0000:c1:00.0", ""), ("0001:03:00.0", "")], timeout=30)
        (sys / CARD1 / "serial_number").write_text("692251009999\n")
        eventually(lambda: ("0000:c1:00.0", "692251009999") in present(), timeout=30)
    finally:
        assert agent.stop() == 0
    assert [c for c in changes(url) if c[2] != "present"] == [
        ("gpu-node-3", "0000:c1:00.0", "serial", "", "692251009999")
    ]
    devs = get(app, "/v1/nodes/gpu-node-3/devices").json()["data"]["devices"]
    assert {d["slot"]: d["serial"] for d in devs} == {
        "0000:c1:00.0": "692251009999",
        "0001:03:00.0": "",
    }


def test_one_batch_with_an_inventory_a_change_and_the_inventory_again(tmp_path: Path) -> None:
    """The writer hands a batch of events at once: a device inserted by the batch and
    changed later in it is one row; the same batch again writes nothing."""
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import create_engine

    from lens_ebpf.protocol.gen import lens_pb2 as pb
    from lens_ebpf.recorder.ingest.node_events import apply_devices, device_update
    from lens_ebpf.recorder.store.writer import upgrade

    url = f"sqlite:///{tmp_path / 'r.db'}"
    eng = create_engine(url)
    upgrade(eng)
    t0 = datetime(2026, 11, 25, 6, 0, tzinfo=UTC)

    def gpu(slot: str, serial: str) -> pb.DeviceChange:
        return pb.DeviceChange(
            device_kind="gpu", slot=slot, bdf=slot, key=f"k-{slot}", serial=serial, vendor="amd"
        )

    inv = pb.Event(device_inventory=pb.DeviceInventory(devices=[gpu("a", "S1"), gpu("b", "S2")]))
    change = pb.Event(
        device_change=pb.DeviceChange(
            **{
                **{
                    f.name: getattr(gpu("a", "S9"), f.name)
                    for f in pb.DeviceChange.DESCRIPTOR.fields
                    if f.name != "fields"
                },
                "change": "changed",
            }
        )
    )
    again = pb.Event(device_inventory=pb.DeviceInventory(devices=[gpu("a", "S9")]))  # b gone
    batch = [
        device_update("local", "n1", ev, t0 + timedelta(seconds=i))
        for i, ev in enumerate((inv, change, again))
    ]
    with eng.begin() as conn:
        assert apply_devices(conn, [u for u in batch if u is not None]) == 4
    assert [
        (r["slot"], r["field"], r["old_value"], r["new_value"])
        for r in rows(url, "device_changelog")
    ] == [
        ("a", "present", "", "true"),
        ("b", "present", "", "true"),
        ("a", "serial", "S1", "S9"),
        ("b", "present", "true", "false"),
    ]
    assert sorted((r["slot"], r["serial"], r["present"]) for r in rows(url, "node_devices")) == [
        ("a", "S9", True),
        ("b", "S2", False),
    ]
    with eng.begin() as conn:  # the last inventory once more: nothing new
        assert apply_devices(conn, [batch[2]]) == 0  # type: ignore[list-item]
    eng.dispose()


def test_a_gpu_that_asks_for_a_reset_and_gets_one(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    """NVML's recovery action (an Xid asks for a reset, the reset done) is a field of the
    record: one changelog row each way, and the device routes show it."""
    from lens_ebpf.agent.devices.gpu.model import GpuReading

    def h100(action: str) -> GpuReading:
        return GpuReading(
            index=0,
            vendor="nvidia",
            name="NVIDIA H100 80GB HBM3",
            uuid="GPU-11111111-2222-3333-4444-555555555555",
            bdf="00000000:18:00.0",
            serial="1650923010481",
            recovery_action=action,
        )

    app = recorder_app(db_url)
    with reporting(app) as (bus, reporter):
        watch = DeviceWatch(bus.publish)
        watch.expect("gpu")
        for action in ("none", "gpu_reset", "none"):
            watch.update("gpu", records.gpu_records([h100(action)], "gpu-1"))
        eventually(lambda: reporter.acked == 3, timeout=15)
        assert app.writer.flush(10)
    assert changes(db_url) == [
        ("gpu-1", "00000000:18:00.0", "present", "", "true"),
        ("gpu-1", "00000000:18:00.0", "recovery_action", "none", "gpu_reset"),
        ("gpu-1", "00000000:18:00.0", "recovery_action", "gpu_reset", "none"),
    ]
    devs = get(app, "/v1/nodes/gpu-1/devices").json()["data"]["devices"]
    assert [(d["uuid"], d["recovery_action"]) for d in devs] == [
        ("GPU-11111111-2222-3333-4444-555555555555", "none")
    ]


def test_a_gpus_history_names_every_pod_that_held_it(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    """The kubelet gives the GPU in slot c1 to a Deployment's pod, then to a pod the
    service does not track, then to no one: devices/{serial}/history lists both holders
    with their spans (the Deployment named), next to the Xid the first one saw."""
    from lens_ebpf.agent.devices.gpu.model import GpuReading
    from tests.recorder.objects import gpu_pod, state, template, workload

    spec = {"replicas": 1, "template": template("amd.com/gpu", 1)}
    api.put("deployments", workload("trainer", spec, {"replicas": 1}))
    api.put("replicasets", workload("trainer-5d9f", spec, {"replicas": 1}, "trainer"))
    p = gpu_pod("trainer-5d9f-a", "trainer-5d9f", "amd.com/gpu", 1, "gpu-1")
    api.put("pods", p)
    api.put("pods", state(p, "Running", True))
    app = recorder_app(db_url)
    eventually(
        lambda: len(rows(db_url, "gpu_pods")) == 1 and len(rows(db_url, "gpu_workloads")) == 2,
        timeout=15,
    )

    def mi300(holder: str) -> dict[str, Any]:
        gpu = GpuReading(
            vendor="amd",
            bdf="0000:c1:00.0",
            name="AMD Instinct MI300X",
            serial="692251001234",
            unique_id="0x18a96c02d4e1c0a3",
        )
        ns, _, pod = holder.partition("/")
        return records.gpu_records(
            [gpu], "gpu-1", {gpu.bdf: {"namespace": ns, "pod": pod}} if holder else {}
        )

    with reporting(app) as (bus, reporter):  # node gpu-1
        watch = DeviceWatch(bus.publish)
        watch.expect("gpu")
        watch.update("gpu", mi300(""))
        watch.update("gpu", mi300("ml/trainer-5d9f-a"))
        bus.publish(xid("79", "trainer-5d9f-a"))
        watch.update("gpu", mi300("batch/eval-0"))
        watch.update("gpu", mi300(""))
        eventually(lambda: reporter.acked == 5, timeout=15)
        assert app.writer.flush(10)
    held = [(c[2], c[3], c[4]) for c in changes(db_url) if c[2] == "holder"]
    assert held == [
        ("holder", "", "ml/trainer-5d9f-a"),
        ("holder", "ml/trainer-5d9f-a", "batch/eval-0"),
        ("holder", "batch/eval-0", ""),
    ]
    hist = get(app, "/v1/devices/692251001234/history").json()["data"]
    holders = hist["holders"]
    assert [(h["namespace"], h["pod"], h["workload"]) for h in holders] == [
        ("ml", "trainer-5d9f-a", "Deployment/trainer"),
        ("batch", "eval-0", ""),
    ]
    at = {(c["field"], c["new"]): c["time"] for c in hist["changes"]}
    assert (holders[0]["from"], holders[0]["to"]) == (
        at[("holder", "ml/trainer-5d9f-a")],
        at[("holder", "batch/eval-0")],
    )
    assert (holders[1]["from"], holders[1]["to"]) == (
        at[("holder", "batch/eval-0")],
        at[("holder", "")],
    )
    assert [(f["code"], f["pod"]) for f in hist["faults"]] == [("79", "trainer-5d9f-a")]
