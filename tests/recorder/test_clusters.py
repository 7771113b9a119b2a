"""Many clusters: two API stand-ins as two clusters (the second from the multi-k8s-config
Secret), each with a node gpu-0 and the same workload and pod UIDs; ?cluster= on the API,
reporters that say their cluster, a kubeconfig removed from the Secret stopping its
watches, a broken one reported while the others go on; the storage config exporter's
merged Secret byte for byte, written only when it changed."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import requests

from lens_ebpf.protocol.gen import lens_pb2 as pb
from lens_ebpf.protocol.gen import lens_pb2_grpc
from tests.conftest import hang_guard
from tests.k8slab import FakeApiServer, eventually
from tests.recorder.conftest import rows
from tests.recorder.objects import KIND, U, gpu_pod, has_finalizer, state, workload
from tests.recorder.test_cluster_api import node
from tests.recorder.test_faults import metric
from tests.recorder.test_training import get

LENS = "lens"  # the service's namespace, where its Secrets are


@pytest.fixture(scope="module")
def prometheus() -> Iterator[Any]:
    """A real, empty Prometheus (the node list asks it for utilization: none, 0)."""
    from tests.promserver import Prometheus, available

    if available():
        pytest.skip(available())
    p = Prometheus([])
    yield p
    p.stop()


@pytest.fixture()
def api_b() -> Iterator[FakeApiServer]:
    srv = FakeApiServer().start()
    yield srv
    srv.kill()


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def secret(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": name, "namespace": LENS},
        "data": data,
    }


def bert(api: FakeApiServer, on: str) -> None:
    """The PyTorchJob bert (the same UID in every cluster) with one pod, 2 GPUs, running."""
    api.put(
        KIND["bert"][2],
        workload("bert", {}, {"conditions": [{"type": "Running", "status": "True"}]}),
    )
    api.put(
        "pods",
        state(gpu_pod("bert-worker-0", "bert", "nvidia.com/gpu", 2, on), "Running", ready=True),
    )


def answer(app: Any, path: str) -> tuple[int, Any]:
    r = requests.get(f"http://127.0.0.1:{app.http.port}{path}", timeout=hang_guard(5))
    return r.status_code, r.json()


def report(port: int, cluster: str, node_name: str, events: list[pb.Event]) -> list[int]:
    meta = (("lens-node", node_name),) + ((("lens-cluster", cluster),) if cluster else ())
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = lens_pb2_grpc.CollectorServiceStub(ch)
        return [a.seq for a in stub.Report(iter(events), metadata=meta)]


def inventory(seq: int, serial: str) -> pb.Event:
    gpu = pb.DeviceChange(
        device_kind="gpu",
        slot="0000:11:00.0",
        bdf="0000:11:00.0",
        key=f"GPU-{serial}",
        uuid=f"GPU-{serial}",
        serial=serial,
        vendor="nvidia",
        model="NVIDIA H100 80GB HBM3",
    )
    return pb.Event(
        seq=seq,
        ts_unix_nano=1_795_000_000_000_000_000 + seq,
        device_inventory=pb.DeviceInventory(devices=[gpu]),
    )


def test_two_clusters_one_service(
    api: FakeApiServer,
    api_b: FakeApiServer,
    recorder_app: Any,
    db_url: str,
    tmp_path: Path,
    prometheus: Any,
) -> None:
    api.put("nodes", node("gpu-0", "True", {"nvidia.com/gpu": "8"}, "10.0.0.10"))
    bert(api, "gpu-0")
    api_b.put("nodes", node("gpu-0", "True", {"nvidia.com/gpu": "8"}, "10.1.0.10"))
    api_b.put("nodes", node("gpu-1", "True", {"nvidia.com/gpu": "8"}, "10.1.0.11"))
    bert(api_b, "gpu-1")
    kubeconfig_b = api_b.kubeconfig(tmp_path / "b.kubeconfig").read_text()
    api.put("secrets", secret("multi-k8s-config", {"b": b64(kubeconfig_b)}))
    app = recorder_app(
        db_url,
        prometheus__url=prometheus.base,
        top={
            ("multicluster", "secret"): "multi-k8s-config",
            ("multicluster", "namespace"): LENS,
            ("multicluster", "reload_seconds"): 0.3,
        },
    )

    def clusters() -> list[tuple[str, str, bool, bool]]:
        return [(c["name"], c["source"], c["up"], c["home"]) for c in get(app, "/api/clusters")]

    eventually(
        lambda: clusters() == [("local", "home", True, True), ("b", "secret", True, False)],
        timeout=15,
    )
    assert get(app, "/api/gpu-aggregation/clusters") == ["b", "local"]
    assert metric(app, 'lens_recorder_cluster_up{cluster="b"}') == 1

    def nodes(query: str) -> tuple[list[tuple[str, str, int]], str]:
        got = get(app, f"/api/nodes{query}")
        return [(n["name"], n["ip"], n["gpu_allocation"]) for n in got["data"]], got["cluster_name"]

    b_nodes = ([("gpu-0", "10.1.0.10", 0), ("gpu-1", "10.1.0.11", 2)], "b")
    eventually(lambda: nodes("?cluster=b") == b_nodes, timeout=15)
    assert nodes("") == ([("gpu-0", "10.0.0.10", 2)], "local")
    assert nodes("?cluster=local") == nodes("")

    # the same workload and pod UIDs in both: one row each, each cluster's own pod
    def pods_of_bert(query: str) -> list[tuple[str, str]]:
        got = get(app, f"/api/workloads/{U['bert']}{query}")
        return [(p["podName"], p["nodeName"]) for p in got["pods"]]

    eventually(lambda: pods_of_bert("?cluster=b") == [("bert-worker-0", "gpu-1")], timeout=15)
    assert pods_of_bert("") == [("bert-worker-0", "gpu-0")]
    assert sorted((r["cluster"], r["uid"], r["node"]) for r in rows(db_url, "gpu_pods")) == [
        ("b", "uid-bert-worker-0", "gpu-1"),
        ("local", "uid-bert-worker-0", "gpu-0"),
    ]
    # finalizers per cluster, each on its own API
    eventually(lambda: has_finalizer(api, "bert") and has_finalizer(api_b, "bert"), timeout=15)

    # reporters say their cluster: the same node name and sequence numbers in both
    assert report(app.collect_port, "b", "gpu-0", [inventory(1, "SB1")]) == [0, 1]
    assert report(app.collect_port, "", "gpu-0", [inventory(1, "SH1")]) == [0, 1]
    assert report(app.collect_port, "b", "gpu-0", [inventory(1, "SB1")]) == [1]  # held: a replay

    def serials(query: str) -> list[str]:
        return [d["serial"] for d in get(app, f"/api/nodes/gpu-0/devices{query}")["devices"]]

    assert serials("?cluster=b") == ["SB1"]
    assert serials("") == ["SH1"]
    assert sorted((r["cluster"], r["node"], r["seq"]) for r in rows(db_url, "node_events")) == [
        ("b", "gpu-0", 1),
        ("local", "gpu-0", 1),
    ]

    status, body = answer(app, "/api/nodes?cluster=nowhere")
    assert (status, body["meta"]["code"]) == (404, 4004)
    assert "known: b, local" in body["meta"]["message"]

    # a broken kubeconfig: said, counted as down, the others go on, the service ready
    api.put(
        "secrets",
        secret("multi-k8s-config", {"b": b64(kubeconfig_b), "c": b64("clusters: [unclosed")}),
    )
    eventually(
        lambda: [c["name"] for c in get(app, "/api/clusters")] == ["local", "b", "c"], timeout=15
    )
    c = get(app, "/api/clusters")[2]
    assert (c["up"], c["source"]) == (False, "secret") and "kubeconfig" in c["error"]
    assert metric(app, 'lens_recorder_cluster_up{cluster="c"}') == 0
    status, ready = answer(app, "/readyz")
    assert status == 200 and [x["name"] for x in ready["clusters"] if not x["up"]] == ["c"]
    status, body = answer(app, "/api/storage/overview?cluster=c")
    assert (status, body["meta"]["code"]) == (503, 5003) and "not watched" in body["meta"][
        "message"
    ]

    # b's kubeconfig removed: its watches stop within one reload; its history stays
    assert api_b.open_watches() > 0
    api.put("secrets", secret("multi-k8s-config", {}))
    eventually(lambda: [c["name"] for c in get(app, "/api/clusters")] == ["local"], timeout=15)
    eventually(lambda: api_b.open_watches() == 0, timeout=15)
    # nothing in b would take its finalizers off later: they went with it
    eventually(lambda: not has_finalizer(api_b, "bert"), timeout=15)
    assert metric(app, 'lens_recorder_cluster_finalizers_released_total{cluster="b"}') == 1
    assert [r["cluster"] for r in rows(db_url, "nodes")].count("b") == 2
    status, _ = answer(app, "/api/nodes?cluster=b")
    assert status == 404
    assert metric(app, 'lens_recorder_cluster_reloads_total{result="ok"}') >= 3


def test_clusters_from_the_config_and_a_bad_secret(
    api: FakeApiServer, api_b: FakeApiServer, recorder_app: Any, tmp_path: Path, prometheus: Any
) -> None:
    """clusters: names a kubeconfig file; a Secret key that is not a cluster name keeps the
    clusters as they are, said in /readyz."""
    path = api_b.kubeconfig(tmp_path / "b.kubeconfig")
    api_b.put("nodes", node("gpu-7", "True", {"amd.com/gpu": "8"}, "10.1.0.17"))
    api.put("secrets", secret("multi-k8s-config", {"Not_A_Name": b64("x")}))
    app = recorder_app(
        f"sqlite:///{tmp_path / 'r.db'}",
        prometheus__url=prometheus.base,
        top={
            ("clusters",): {"b": {"kubeconfig": str(path)}},
            ("multicluster", "secret"): "multi-k8s-config",
            ("multicluster", "namespace"): LENS,
        },
    )
    eventually(
        lambda: [n["name"] for n in get(app, "/api/nodes?cluster=b")["data"]] == ["gpu-7"],
        timeout=15,
    )
    assert [(c["name"], c["source"]) for c in get(app, "/api/clusters")] == [
        ("local", "home"),
        ("b", "config"),
    ]
    _, ready = answer(app, "/readyz")
    assert "'Not_A_Name' is not a cluster name" in ready["clusters_secret_error"]
    assert metric(app, 'lens_recorder_cluster_reloads_total{result="error"}') == 1
    # the POST routes read the home cluster's pods: another cluster's body is refused, counted
    base = f"http://127.0.0.1:{app.http.port}"
    r = requests.post(
        f"{base}/logs?cluster=b&namespace=ml&pod=p&container=c",
        data=b"x\n",
        headers={"Content-Type": "text/plain"},
        timeout=hang_guard(5),
    )
    assert r.status_code == 404 and "cluster 'local''s only, not 'b'" in r.json()["meta"]["message"]
    assert metric(app, 'lens_recorder_post_requests_total{route="/logs",code="404"}') == 1
    r = requests.post(
        f"{base}/logs?cluster=local&namespace=ml&pod=p&container=c",
        data=b"x\n",
        headers={"Content-Type": "text/plain"},
        timeout=hang_guard(5),
    )
    assert r.status_code == 200 and r.json()["data"]["not_gpu_pod"] == 1


def storage_config(text: str) -> dict[str, str]:
    return {"config.yaml": b64(text), "postgres-password": b64("pw-" + text[:4])}


def test_the_storage_config_exporter(
    api: FakeApiServer, api_b: FakeApiServer, recorder_app: Any, tmp_path: Path
) -> None:
    api.put("secrets", secret("storage-config", storage_config("postgres: {host: db-a}\n")))
    api_b.put("secrets", secret("storage-config", storage_config("postgres: {host: db-b}\n")))
    app = recorder_app(
        f"sqlite:///{tmp_path / 'r.db'}",
        top={
            ("clusters",): {"b": {"kubeconfig": str(api_b.kubeconfig(tmp_path / "b.kubeconfig"))}},
            ("multicluster", "namespace"): LENS,
            ("multicluster", "storage_config_sync"): True,
            ("multicluster", "sync_seconds"): 0.2,
        },
    )

    def merged() -> dict[str, dict[str, str]] | None:
        got = api.get("secrets", LENS, "multi-storage-config")
        if got is None:
            return None
        return {k: json.loads(base64.b64decode(v)) for k, v in got["data"].items()}

    eventually(lambda: merged() is not None, timeout=15)
    # each cluster's key: its storage-config's data, every value byte for byte
    assert merged() == {
        "b": api_b.get("secrets", LENS, "storage-config")["data"],
        "local": api.get("secrets", LENS, "storage-config")["data"],
    }
    raw = api.get("secrets", LENS, "multi-storage-config")["data"]["b"]
    assert (
        base64.b64decode(raw)
        == json.dumps(
            storage_config("postgres: {host: db-b}\n"), sort_keys=True, separators=(",", ":")
        ).encode()
    )

    def writes() -> int:
        return sum(1 for r in api.requests if "/secrets" in r and r.split()[0] in ("POST", "PUT"))

    eventually(lambda: app.storage_sync.runs["unchanged"] >= 3, timeout=15)
    assert writes() == 1 and app.storage_sync.runs["written"] == 1  # not rewritten

    api_b.put("secrets", secret("storage-config", storage_config("postgres: {host: db-b2}\n")))
    eventually(
        lambda: (merged() or {}).get("b") == storage_config("postgres: {host: db-b2}\n"), timeout=15
    )
    assert writes() == 2

    # b cannot be read: counted and shown, the merged Secret left as it is
    api_b.kill()
    eventually(lambda: app.storage_sync.runs["unreadable"] >= 2, timeout=30)
    assert writes() == 2 and list(app.storage_sync.unreadable) == ["b"]
    assert metric(app, 'lens_recorder_storage_config_syncs_total{result="unreadable"}') >= 2
    _, ready = answer(app, "/readyz")
    assert list(ready["storage_config_sync"]["unreadable"]) == ["b"]
    assert (merged() or {}).get("b") == storage_config("postgres: {host: db-b2}\n")


def test_uninstall_takes_the_finalizers_off_in_every_cluster(
    api: FakeApiServer, api_b: FakeApiServer, recorder_app: Any, tmp_path: Path
) -> None:
    from lens_ebpf.k8s.client import api_client
    from lens_ebpf.recorder import cli, config

    bert(api, "gpu-0")
    bert(api_b, "gpu-1")
    url = f"sqlite:///{tmp_path / 'r.db'}"
    clusters = {"b": {"kubeconfig": str(api_b.kubeconfig(tmp_path / "b.kubeconfig"))}}
    app = recorder_app(url, top={("clusters",): clusters})
    eventually(lambda: has_finalizer(api, "bert") and has_finalizer(api_b, "bert"), timeout=15)
    app.stop()
    cfg = config.load(
        env={}, overrides={("recorder", "database_url"): url, ("clusters",): clusters}
    )
    home = api_client("kubeconfig", str(api.kubeconfig(tmp_path / "home.kubeconfig")))
    got = cli.remove_finalizers(cfg, home)
    assert (got["PyTorchJob"], got["b: PyTorchJob"]) == (1, 1)
    assert not has_finalizer(api, "bert") and not has_finalizer(api_b, "bert")
