"""Storage routes against the API stand-in's StorageClasses, CSI drivers, volumes, claims
and events, and a real Prometheus holding the agents' volume series: exact numbers, a
claim mounted by two pods on two nodes counted once, and each unhealthy reason named."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests

from tests.conftest import hang_guard
from tests.k8slab import FakeApiServer
from tests.recorder.test_faults import metric
from tests.recorder.test_training import get

TI, GI = 1 << 40, 1 << 30


def stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def objects(api: FakeApiServer, now: datetime) -> None:
    def sc(name: str, provisioner: str, default: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name}
        if default:
            meta["annotations"] = {"storageclass.kubernetes.io/is-default-class": "true"}
        return {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": meta,
            "provisioner": provisioner,
            "reclaimPolicy": "Delete",
        }

    api.put("storageclasses", sc("fast-nvme", "nvme.csi.example.com", default=True))
    api.put("storageclasses", sc("shared-nfs", "nfs.csi.k8s.io"))
    api.put("storageclasses", sc("slow", "kubernetes.io/no-provisioner"))
    api.put(
        "csidrivers",
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSIDriver",
            "metadata": {"name": "nvme.csi.example.com"},
            "spec": {"attachRequired": True},
        },
    )
    for name, cls, size, phase in (
        ("pv-1", "fast-nvme", "1Ti", "Bound"),
        ("pv-2", "shared-nfs", "500Gi", "Bound"),
        ("pv-3", "slow", "100Gi", "Failed"),
    ):
        api.put(
            "persistentvolumes",
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": name},
                "spec": {"storageClassName": cls, "capacity": {"storage": size}},
                "status": {"phase": phase},
            },
        )
    for name, cls, req, phase, pv, cap, age, modes in (
        ("train-data", "fast-nvme", "1Ti", "Bound", "pv-1", "1Ti", 3600, ["ReadWriteOnce"]),
        ("model-cache", "shared-nfs", "100Gi", "Bound", "pv-2", "500Gi", 3600, ["ReadWriteMany"]),
        ("scratch", "fast-nvme", "200Gi", "Pending", "", "", 600, ["ReadWriteOnce"]),
        ("fresh", "fast-nvme", "10Gi", "Pending", "", "", 30, ["ReadWriteOnce"]),
        ("other", "slow", "5Gi", "Pending", "", "", 120, ["ReadWriteOnce"]),
    ):
        status: dict[str, Any] = {"phase": phase}
        if cap:
            status["capacity"] = {"storage": cap}
        api.put(
            "persistentvolumeclaims",
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {
                    "name": name,
                    "namespace": "ml",
                    "creationTimestamp": stamp(now - timedelta(seconds=age)),
                },
                "spec": {
                    "storageClassName": cls,
                    "accessModes": modes,
                    "volumeName": pv,
                    "resources": {"requests": {"storage": req}},
                },
                "status": status,
            },
        )
    api.put(
        "pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "serve-0", "namespace": "ml"},
            "spec": {
                "nodeName": "gpu-1",
                "containers": [{"name": "s", "image": "x"}],
                "volumes": [
                    {"name": "models", "persistentVolumeClaim": {"claimName": "model-cache"}}
                ],
            },
            "status": {"phase": "Pending"},
        },
    )
    for i, (kind, name, reason, ago, type_) in enumerate(
        (
            ("PersistentVolumeClaim", "other", "ProvisioningFailed", 30, "Warning"),
            ("Pod", "serve-0", "FailedMount", 20, "Warning"),
            ("Pod", "serve-0", "FailedMount", 7200, "Warning"),  # before this scan's window
            ("PersistentVolumeClaim", "train-data", "ProvisioningSucceeded", 10, "Normal"),
        )
    ):
        api.put(
            "events",
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"e{i}", "namespace": "ml"},
                "involvedObject": {"kind": kind, "name": name, "namespace": "ml"},
                "reason": reason,
                "type": type_,
                "message": f"{reason}: the storage said no",
                "lastTimestamp": stamp(now - timedelta(seconds=ago)),
            },
        )


def series(t0: int) -> str:
    """The agents' measure of the claims: train-data on gpu-1, model-cache mounted by two
    pods on two nodes (the same figure from both kubelets)."""
    rows = [
        ("train-0", "gpu-1", "train-data", "data", 133143986176, 966367641600),
        ("serve-0", "gpu-1", "model-cache", "models", 53687091200, 483183820800),
        ("serve-1", "gpu-2", "model-cache", "models", 53687091200, 483183820800),
    ]
    out = []
    for fam, col in (("lens_pod_volume_used_bytes", 4), ("lens_pod_volume_available_bytes", 5)):
        out.append(f"# TYPE {fam} gauge\n")
        for r in rows:
            lbl = (
                f'namespace="ml",pod="{r[0]}",node="{r[1]}",persistentvolumeclaim="{r[2]}",'
                f'volume="{r[3]}"'
            )
            out += [f"{fam}{{{lbl}}} {r[col]} {t0 + 60 * m}\n" for m in range(11)]
    return "".join(out) + "# EOF\n"


def test_storage_overview_and_volumes_exact(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    from tests.promserver import Prometheus, available

    if available():
        pytest.skip(available())
    t0 = (int(datetime.now(UTC).timestamp()) // 3600 - 3) * 3600
    now = datetime.fromtimestamp(t0 + 600, UTC)
    objects(api, now)
    prometheus = Prometheus([], openmetrics=series(t0))
    try:
        app = recorder_app(
            db_url, clock=lambda: now, prometheus__url=prometheus.base, storage__scan_seconds=3600
        )
        app.storage.run_once(now)
        over = get(app, "/v1/storage/overview?cluster=local")
        assert over["scanned_at"] == t0 + 600 and over["incomplete"] == []
        by = {b["storage_class"]: b for b in over["backends"]}
        assert by["fast-nvme"] == {
            "storage_class": "fast-nvme",
            "provisioner": "nvme.csi.example.com",
            "csi_driver": "nvme.csi.example.com",
            "default": True,
            "healthy": False,
            "reasons": ["1 claims Pending longer than 300 s: ml/scratch"],
            "pvs": 1,
            "pvcs": 3,
            "bound": 1,
            "pending": 2,
            "capacity_requested_bytes": TI + 200 * GI + 10 * GI,
            "capacity_bytes": TI,
            "used_bytes": 133143986176,
            "pods": 1,
        }
        nfs = by["shared-nfs"]
        got = tuple(
            nfs[k] for k in ("csi_driver", "pvs", "capacity_bytes", "used_bytes", "pods", "healthy")
        )
        assert got == ("", 1, 500 * GI, 53687091200, 2, False)
        assert nfs["reasons"] == [
            "FailedMount on Pod ml/serve-0: FailedMount: the storage " "said no"
        ]  # one: the older event is before the window
        assert by["slow"]["reasons"] == [
            "1 volumes Failed: pv-3",
            "ProvisioningFailed on PersistentVolumeClaim ml/other: ProvisioningFailed: the "
            "storage said no",
        ]
        vols = get(app, "/v1/storage/volumes?page_num=1&page_size=2")
        assert vols["total"] == 5 and [v["name"] for v in vols["data"]] == ["fresh", "model-cache"]
        assert vols["data"][1] == {
            "namespace": "ml",
            "name": "model-cache",
            "storage_class": "shared-nfs",
            "phase": "Bound",
            "volume": "pv-2",
            "access_modes": ["ReadWriteMany"],
            "requested_bytes": 100 * GI,
            "capacity_bytes": 500 * GI,
            "used_bytes": 53687091200,
            "available_bytes": 483183820800,
            "pods": ["ml/serve-0", "ml/serve-1"],
            "nodes": ["gpu-1", "gpu-2"],
        }
        assert metric(app, 'lens_recorder_storage_backend_healthy{storage_class="slow"}') == 0
        # the cluster overview's storage fields: the volumes' capacity, what the claims use
        overview = get(app, "/v1/clusters/overview")
        total, used = TI + 500 * GI + 100 * GI, 133143986176 + 53687091200
        assert (overview["total_space"], overview["used_space"]) == (total, used)
        assert overview["usage_percentage"] == pytest.approx(100 * used / total)
        assert metric(app, 'lens_recorder_storage_scans_total{result="ok"}') >= 1
    finally:
        prometheus.stop()
    # Prometheus gone: the objects still answer, the usage null and meta.message saying why
    app.storage.run_once(now)
    why = (
        f"storage usage (scan at {now:%Y-%m-%dT%H:%M:%SZ}): prometheus at "
        f"{prometheus.base} is unavailable"
    )
    body = requests.get(
        f"http://127.0.0.1:{app.http.port}/api/storage/overview", timeout=hang_guard(5)
    ).json()
    assert body["meta"]["code"] == 2000 and why in body["meta"]["message"], body["meta"]
    over = body["data"]
    assert "unavailable" in over["incomplete"][0]
    got = {b["storage_class"]: (b["used_bytes"], b["pods"], b["pvcs"]) for b in over["backends"]}
    assert got["fast-nvme"] == (None, None, 3)
    (vol,) = get(app, "/v1/storage/volumes?page_num=2&page_size=1")["data"]
    fields = ("name", "capacity_bytes", "used_bytes", "available_bytes", "pods", "nodes")
    assert [vol[k] for k in fields] == ["model-cache", 500 * GI, None, None, None, None]
    body = requests.get(
        f"http://127.0.0.1:{app.http.port}/v1/clusters/overview", timeout=hang_guard(5)
    ).json()
    assert body["meta"]["code"] == 2000 and why in body["meta"]["message"], body["meta"]
    total = TI + 500 * GI + 100 * GI
    # the overview's are the original's float64: 0, unknown (issue 70)
    assert {k: body["data"][k] for k in ("total_space", "used_space", "usage_percentage")} == {
        "total_space": total,
        "used_space": 0.0,
        "usage_percentage": 0.0,
    }
