"""Remote write without a service: which requests are taken, how a series finds its pod
(by each default device label rule, with the exporters' real label sets; by its pod
labels; as of its samples' time), the copies' labels and samples, proxy mode, and 2.0's
symbols; and, over a real SQLite database, a miss reading its node's rows again (once a
second per node, beside the full reads)."""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from lens_ebpf.protocol.gen import lens_pb2 as pb
from lens_ebpf.recorder import config
from lens_ebpf.recorder.gen import remote_write_v1_pb2 as pb1
from lens_ebpf.recorder.gen import remote_write_v2_pb2 as pb2
from lens_ebpf.recorder.ingest.node_events import apply_devices, device_update
from lens_ebpf.recorder.remote_write import index as index_module
from lens_ebpf.recorder.remote_write import wire
from lens_ebpf.recorder.remote_write.index import Index, Indexer, Pod, bdf
from lens_ebpf.recorder.remote_write.relabel import Relabeler
from lens_ebpf.recorder.store import schema
from lens_ebpf.recorder.store.writer import engine_for, insert_rows
from tests.conftest import wait_for

FIX = Path(__file__).parent.parent / "fixtures" / "remote_write"
BERT = (("PyTorchJob", "bert", "uid-pt-bert"),)
DEP = (("ReplicaSet", "web-7d9f", "uid-rs"), ("Deployment", "web", "uid-dep"))
CHANGED = 1_800_000_000_000.0  # ms: GPU 3 of node-a went from worker 0 to worker 1


def exposition(name: str) -> list[dict[str, str]]:
    """Each sample line's labels, __name__ included (the text format's, as it is served)."""
    out = []
    for line in (FIX / name).read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        name_, _, rest = line.partition("{")
        body = rest.rsplit("}", 1)[0]
        labels = {"__name__": name_}
        for part in body.split('",'):
            k, _, v = part.strip().partition("=")
            labels[k.strip()] = v.strip().strip('"')
        out.append(labels)
    return out


class Maps:
    """The maps as an Indexer holds them, its nodes read again within the last second (a
    miss reads nothing: the database's part is tests/recorder's)."""

    def __init__(self, idx: Index) -> None:
        self.index = idx

    def look_again(
        self, node: str, uid: str = "", pod: tuple[str, str] | None = None
    ) -> tuple[bool, Index]:
        return False, self.index


def index() -> Index:
    idx = Index(generation=1)
    idx.nodes = {"i-030791dc5a37cd257", "tw038", "node-a"}
    idx.addresses = {"10.0.0.7": "node-a"}
    idx.gpus = {
        "i-030791dc5a37cd257": {
            ("index", "0"): "0000:31:00.0",
            ("uuid", "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"): "0000:31:00.0",
            ("bdf", "0000:31:00.0"): "0000:31:00.0",
        },
        "tw038": {
            ("index", "2"): "0000:15:00.0",
            ("serial", "692409005408"): "0000:15:00.0",
            ("uuid", "ccff74a1-0000-1000-80e0-c6d49f5b0d86"): "0000:15:00.0",
        },
        "node-a": {("index", "3"): "0000:c1:00.0", ("index", "0"): "0000:01:00.0"},
    }
    idx.holders = {
        ("i-030791dc5a37cd257", "0000:31:00.0"): [(-math.inf, math.inf, "uid-w0")],
        ("tw038", "0000:15:00.0"): [(-math.inf, math.inf, "uid-w1")],
        ("node-a", "0000:c1:00.0"): [(-math.inf, CHANGED, "uid-w0"), (CHANGED, math.inf, "uid-w1")],
        ("node-a", "mlx5_0"): [(0.0, math.inf, "uid-w2")],
        ("node-a", "mlx5_1"): [(0.0, math.inf, "uid-w2"), (0.0, math.inf, "uid-w3")],
    }
    idx.rdma = {"node-a": {"mlx5_0", "mlx5_1"}}
    for i in range(4):
        idx.pods[f"uid-w{i}"] = Pod(f"uid-w{i}", "ml", f"bert-worker-{i}", "node-a", BERT)
    idx.pods["uid-web"] = Pod("uid-web", "web", "web-7d9f-x", "node-a", DEP)
    idx.pods["uid-bare"] = Pod("uid-bare", "ml", "bare", "node-a", ())
    for uid, p in idx.pods.items():
        idx.by_name[(p.namespace, p.name)] = uid
        idx.names.setdefault(p.name, []).append(uid)
    return idx


def relabeler(**over: object) -> Relabeler:
    keys = {("recorder", "remote_write", k): v for k, v in over.items()}
    cfg = config.load(env={}, overrides=keys).recorder.remote_write
    return Relabeler(cfg, Maps(index()))  # type: ignore[arg-type]


def request(series: list[tuple[dict[str, str], list[tuple[float, int]]]]) -> bytes:
    req = pb1.WriteRequest()
    for labels, samples in series:
        ts = req.timeseries.add()
        for k in sorted(labels):
            ts.labels.add(name=k, value=labels[k])
        for v, t in samples:
            ts.samples.add(value=v, timestamp=t)
    return req.SerializeToString()


def written(body: bytes) -> list[tuple[dict[str, str], list[tuple[float, int]]]]:
    req = pb1.WriteRequest.FromString(body)
    out = []
    for ts in req.timeseries:
        names = [lb.name for lb in ts.labels]
        assert names == sorted(names), "labels sorted, as the protocol asks"
        out.append(
            ({lb.name: lb.value for lb in ts.labels}, [(s.value, s.timestamp) for s in ts.samples])
        )
    return out


def test_every_default_rule_finds_the_pod_on_the_exporters_real_series() -> None:
    r = relabeler()
    dcgm = exposition("dcgm-exporter.prom")
    amd = exposition("amd-device-metrics-exporter.prom")
    lens = [
        {"__name__": "gpu_utilization", "gpu_id": "3", "vendor": "amd", "node": "node-a"},
        {
            "__name__": "hw_gpu_utilization_percent",
            "gpu_index": "0",
            "node": "10.0.0.7:9470",
            "gpu_uuid": "not-known",
        },  # instance-style node (an address), index 0: nobody
        {
            "__name__": "lens_rdma_port_transmit_bytes_total",
            "device": "mlx5_0",
            "port": "1",
            "node": "node-a",
        },
    ]
    series = [(lb, [(7.0, 1_700_000_000_000)]) for lb in dcgm + amd + lens]
    out = r.v1(request(series))
    got = written(out.body)
    # dcgm's seven (UUID), AMD's one (gpu_uuid), lens-ebpf's GPU 3 and RDMA port: each a copy
    assert len(got) == len(dcgm) + 1 + 2
    first = got[0][0]
    assert first == {
        **dcgm[0],
        "__name__": "workload_DCGM_FI_DEV_SM_CLOCK",
        "job": "lens-ebpf-recorder",
        "pod_name": "bert-worker-0",
        "pod_uid": "uid-w0",
        "workload_name": "bert",
        "workload_uid": "uid-pt-bert",
    }
    amd_copy = next(lb for lb, _ in got if lb["__name__"] == "workload_gpu_gfx_activity")
    assert (amd_copy["pod_name"], amd_copy["pod"]) == ("bert-worker-1", "")  # theirs kept
    assert {lb["pod_name"] for lb, _ in got[-2:]} == {"bert-worker-0", "bert-worker-2"}
    assert all(s == [(7.0, 1_700_000_000_000)] for _, s in got)  # values, times unchanged
    assert out.counts == {"copied": 10, "no_pod": 1, "no_workload": 0, "rejected": 0}
    assert out.series == 10 and out.written.samples == 11


@pytest.mark.parametrize("rule", ["UUID", "pci_bus_id", "gpu"])
def test_each_dcgm_label_alone_finds_the_gpu(rule: str) -> None:
    base = exposition("dcgm-exporter.prom")[0]
    keep = {"__name__", "Hostname", rule}
    lb = {k: v for k, v in base.items() if k in keep}
    got = written(relabeler().v1(request([(lb, [(1.0, 5)])])).body)
    assert [x["pod_name"] for x, _ in got] == ["bert-worker-0"]


def test_amd_serial_and_index_rules() -> None:
    base = exposition("amd-device-metrics-exporter.prom")[0]
    for keep in ({"serial_number"}, {"gpu_id"}):
        lb = {k: v for k, v in base.items() if k in keep | {"__name__", "hostname"}}
        got = written(relabeler().v1(request([(lb, [(1.0, 5)])])).body)
        assert [x["pod_name"] for x, _ in got] == ["bert-worker-1"], keep


def test_pod_labels_when_no_device_names_the_pod() -> None:
    kube = exposition("dcgm-exporter-kubernetes.prom")  # a GPU the service does not know
    lb = {**kube[0], "namespace": "web", "pod": "web-7d9f-x"}
    got = written(relabeler().v1(request([(lb, [(139.0, 9)])])).body)
    # one copy per workload above the pod: its ReplicaSet and its Deployment
    assert [(x["workload_name"], x["workload_uid"], x["pod_uid"]) for x, _ in got] == [
        ("web-7d9f", "uid-rs", "uid-web"),
        ("web", "uid-dep", "uid-web"),
    ]
    # uid beside the name (kube-state-metrics), and a name no other namespace has
    r = relabeler()
    for extra in ({"pod_name": "web-7d9f-x", "uid": "uid-web"}, {"exported_pod": "web-7d9f-x"}):
        got = written(r.v1(request([({"__name__": "kube_pod_info", **extra}, [(1, 1)])])).body)
        assert {x["pod_uid"] for x, _ in got} == {"uid-web"}, extra
    out = r.v1(
        request(
            [
                ({"__name__": "x", "pod": "bare", "namespace": "ml"}, [(1, 1)]),
                ({"__name__": "x", "pod": "nobody", "namespace": "ml"}, [(1, 1)]),
                ({"__name__": "up", "job": "node"}, [(1, 1), (1, 2)]),
            ]
        )
    )
    assert out.body == b"" and out.series == 0
    assert out.counts == {"copied": 0, "no_pod": 3, "no_workload": 1, "rejected": 0}


def test_a_gpu_that_changed_holders_copies_each_sample_to_its_holder_then() -> None:
    lb = {"__name__": "gpu_utilization", "gpu_id": "3", "node": "node-a"}
    samples = [(10.0, int(CHANGED) - 15000), (20.0, int(CHANGED)), (30.0, int(CHANGED) + 15000)]
    got = written(relabeler().v1(request([(lb, samples)])).body)
    assert [(x["pod_name"], s) for x, s in got] == [
        ("bert-worker-0", samples[:1]),
        ("bert-worker-1", samples[1:]),
    ]
    # a shared RDMA device (two pods' queue pairs): no one pod, counted
    out = relabeler().v1(
        request([({"__name__": "x", "device": "mlx5_1", "node": "node-a"}, [(1.0, 5)])])
    )
    assert out.counts["no_pod"] == 1


def test_proxy_mode_forwards_every_series_with_its_pod_added_never_overwritten() -> None:
    r = relabeler(mode="proxy")
    dcgm = exposition("dcgm-exporter.prom")[4]
    series = [
        (dcgm, [(0.0, 5)]),
        ({"__name__": "up", "job": "node", "instance": "x:1"}, [(1, 5)]),
        ({"__name__": "y", "gpu_id": "3", "node": "node-a", "namespace": "mine"}, [(2, 9)]),
    ]
    req = pb1.WriteRequest.FromString(request(series))
    req.metadata.add(type=pb1.MetricMetadata.GAUGE, metric_family_name="up", help="h")
    out = r.v1(req.SerializeToString())
    got = written(out.body)
    assert len(got) == 2 + 1 + 2  # copy + original, original, copy + original
    originals = [x for x, _ in got if not x["__name__"].startswith("workload_")]
    assert originals[0] == {
        **dcgm,
        "namespace": "ml",
        "pod": "bert-worker-0",
        "workload_kind": "PyTorchJob",
        "workload": "bert",
    }
    assert originals[1] == series[1][0]  # no pod: as it came
    assert originals[2]["namespace"] == "mine"  # never overwritten
    assert [m.metric_family_name for m in pb1.WriteRequest.FromString(out.body).metadata] == ["up"]


def test_remote_write_2_symbols_and_references() -> None:
    req = pb2.Request(
        symbols=[
            "",
            "__name__",
            "DCGM_FI_DEV_GPU_UTIL",
            "Hostname",
            "i-030791dc5a37cd257",
            "gpu",
            "0",
            "help text",
            "trace_id",
            "abc",
        ]
    )
    ts = req.timeseries.add(labels_refs=[1, 2, 3, 4, 5, 6])
    ts.samples.add(value=42.0, timestamp=1000)
    ts.exemplars.add(labels_refs=[8, 9], value=1.0, timestamp=1000)
    ts.metadata.type = pb2.Metadata.METRIC_TYPE_GAUGE
    ts.metadata.help_ref = 7
    out = relabeler(mode="proxy").v2(req.SerializeToString())
    got = pb2.Request.FromString(out.body)
    sym = list(got.symbols)

    def labels(t: pb2.TimeSeries) -> dict[str, str]:
        return {
            sym[t.labels_refs[i]]: sym[t.labels_refs[i + 1]]
            for i in range(0, len(t.labels_refs), 2)
        }

    copy, proxied = got.timeseries
    assert labels(copy) == {
        "__name__": "workload_DCGM_FI_DEV_GPU_UTIL",
        "Hostname": "i-030791dc5a37cd257",
        "gpu": "0",
        "job": "lens-ebpf-recorder",
        "pod_name": "bert-worker-0",
        "pod_uid": "uid-w0",
        "workload_name": "bert",
        "workload_uid": "uid-pt-bert",
    }
    assert labels(proxied)["pod"] == "bert-worker-0"
    for t in (copy, proxied):
        assert [(s.value, s.timestamp) for s in t.samples] == [(42.0, 1000)]
        assert [sym[i] for i in t.exemplars[0].labels_refs] == ["trace_id", "abc"]
        assert sym[t.metadata.help_ref] == "help text"
    assert (out.written.samples, out.written.exemplars) == (1, 1)
    # a reference past the symbols is that series' alone: left out, named (partial write)
    past = pb2.TimeSeries(labels_refs=[5, 6], samples=[pb2.Sample()])
    bad = pb2.Request(symbols=[""], timeseries=[past])
    got = relabeler().v2(bad.SerializeToString())
    assert (got.series, got.written.samples) == (0, 0)
    assert got.invalid == [
        "series 0: a label, exemplar or metadata reference past the symbols " "table"
    ]


def test_an_odd_series_is_its_own_not_its_requests() -> None:
    """A device index no GPU has (a superscript two, 5,000 digits) finds no pod; a series
    whose bytes cannot be read is left out and named; the rest of the request is as it
    would be without them (Prometheus's partial write)."""
    at = 1_700_000_000_000
    gpu = [
        ({"__name__": "gpu_utilization", "gpu_id": v, "node": "node-a"}, [(1.0, at)])
        for v in ("3", "²", "9" * 5000, "0003")
    ]
    bad = wire.field(0x0A, wire.label("__name__", "up") + b"\x12\x05\x09\x00")  # cut short
    out = relabeler().v1(request(gpu[:2]) + bad + request(gpu[2:]))
    assert [lb["pod_name"] for lb, _ in written(out.body)] == ["bert-worker-0"] * 2
    assert (out.counts["copied"], out.counts["no_pod"], out.written.samples) == (2, 2, 4)
    assert out.invalid == ['series 2 {__name__="up"}: a sample longer than its series']


def test_which_requests_are_taken() -> None:
    v1 = {
        "content-type": "application/x-protobuf",
        "content-encoding": "snappy",
        "x-prometheus-remote-write-version": "0.1.0",
    }
    assert wire.version(v1) == wire.V1
    assert wire.version({**v1, "x-prometheus-remote-write-version": ""}) == wire.V1
    v2 = {
        **v1,
        "content-type": "application/x-protobuf;proto=io.prometheus.write.v2.Request",
        "x-prometheus-remote-write-version": "2.0.0",
    }
    assert wire.version(v2) == wire.V2
    for bad, why in (
        ({**v1, "content-type": "application/json"}, "Content-Type"),
        ({**v1, "content-type": "application/x-protobuf;proto=x.Y"}, "proto=x.Y"),
        ({**v1, "content-encoding": "gzip"}, "snappy"),
        ({**v1, "x-prometheus-remote-write-version": "9.9.9"}, "9.9.9"),
    ):
        with pytest.raises(wire.WireError) as err:
            wire.version(bad)
        assert err.value.status == 415 and why in str(err.value)
    body = request([({"__name__": "x"}, [(1.0, 1)])])
    assert wire.unsnappy(wire.snappy(body), 1 << 20) == body
    big = wire.snappy(b"\0" * 100_000)
    for data, status in ((big, 413), (b"\xff\xff\xff", 400), (b"\x05garbage", 400)):
        with pytest.raises(wire.WireError) as err:
            wire.unsnappy(data, 50_000)
        assert err.value.status == status
    with pytest.raises(wire.WireError) as err:
        relabeler().v1(b"\x0a\xff\xff")
    assert err.value.status == 400


def test_pci_addresses_as_the_agents_write_them() -> None:
    assert bdf("00000000:3B:00.0") == "0000:3b:00.0"
    assert bdf("0000:c1:00.0") == "0000:c1:00.0"


def test_new_maps_keep_the_copies_of_series_whose_pod_did_not_change() -> None:
    maps = Maps(index())
    cfg = config.load(env={}).recorder.remote_write
    r = Relabeler(cfg, maps)  # type: ignore[arg-type]
    a = {"__name__": "gpu_utilization", "gpu_id": "0", "node": "node-a"}  # unheld
    b = {"__name__": "gpu_utilization", "gpu_id": "3", "node": "node-a"}  # held by worker 1
    req = request([(a, [(1.0, int(CHANGED) + 1)]), (b, [(2.0, int(CHANGED) + 1)])])
    assert [x["pod_name"] for x, _ in written(r.v1(req).body)] == ["bert-worker-1"]
    kept = {k: v.copies for k, v in r.cache.items()}
    new = index()
    new.generation = 2
    new.holders[("node-a", "0000:01:00.0")] = [(-math.inf, math.inf, "uid-w2")]  # a pod came
    maps.index = new
    got = written(r.v1(req).body)
    assert [x["pod_name"] for x, _ in got] == ["bert-worker-2", "bert-worker-1"]
    same = [k for k, v in r.cache.items() if v.copies is kept[k]]
    assert len(same) == 1  # b's copies were not built again


# -- a node's entries read again on a miss, from a real database (SQLite) ------------------
NOW = datetime(2026, 11, 23, 6, 0, tzinfo=UTC)


def node_row(name: str, address: str) -> dict[str, Any]:
    """A nodes row, as the Node watch writes it."""
    return {
        "cluster": "local",
        "name": name,
        "address": address,
        "status": "Ready",
        "gpu_capacity": {},
        "gpu_allocatable": {},
        "labels": {},
        "updated_at": NOW,
    }


def pod_row(name: str, node: str) -> dict[str, Any]:
    """A gpu_pods row of a bert worker, as the tracker writes it."""
    return {
        "cluster": "local",
        "uid": f"uid-{name}",
        "namespace": "ml",
        "name": name,
        "node": node,
        "gpus": 1,
        "gpu_resources": {"nvidia.com/gpu": 1},
        "phase": "Running",
        "running": True,
        "deleted": False,
        "workload_uid": "uid-pt-bert",
        "created_at": NOW,
        "updated_at": NOW,
    }


class Cluster:
    """A recorder database (SQLite, its tables from the schema) holding one PyTorchJob's
    pods on node-a, written as the tracker and the node's agent write them, and an Indexer
    over it whose second (its monotonic clock) the test moves."""

    def __init__(self, path: Path) -> None:
        self.engine = engine_for(f"sqlite:///{path}")
        schema.metadata.create_all(self.engine)
        self.seconds = 100.0
        self.indexer = Indexer(
            self.engine, 10.0, lambda: NOW, "local", monotonic=lambda: self.seconds
        )
        self.statements: list[str] = []
        event.listen(self.engine, "before_cursor_execute", self._seen)
        with self.engine.begin() as conn:
            insert_rows(conn, schema.nodes, [node_row("node-a", "10.0.0.7")])
            insert_rows(
                conn,
                schema.gpu_workloads,
                [
                    {
                        "cluster": "local",
                        "uid": "uid-pt-bert",
                        "api_version": "kubeflow.org/v1",
                        "kind": "PyTorchJob",
                        "namespace": "ml",
                        "name": "bert",
                        "gpu_resources": {},
                        "labels": {},
                        "updated_at": NOW,
                    }
                ],
            )
        self.pod_starts("bert-worker-0", 0)

    def _seen(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.statements.append(statement)

    def pod_starts(self, name: str, index: int, tracked: bool = True) -> None:
        """The pod's rows (tracked False: not yet), then its GPU as the agent reports
        it: a device_change with its holder."""
        with self.engine.begin() as conn:
            if tracked:
                insert_rows(conn, schema.gpu_pods, [pod_row(name, "node-a")])
                insert_rows(
                    conn,
                    schema.workload_pod_references,
                    [
                        {
                            "cluster": "local",
                            "workload_uid": "uid-pt-bert",
                            "pod_uid": f"uid-{name}",
                            "created_at": NOW,
                        }
                    ],
                )
            gpu = pb.DeviceChange(
                device_kind="gpu",
                vendor="nvidia",
                change="appeared",
                slot=f"0000:0{index}:00.0",
                bdf=f"0000:0{index}:00.0",
                index=index,
                key=f"GPU-{index}",
                uuid=f"GPU-{index}",
                holder=f"ml/{name}",
            )
            ev = pb.Event(seq=index + 1, ts_unix_nano=int(NOW.timestamp() * 1e9), device_change=gpu)
            update = device_update("local", "node-a", ev, NOW)
            assert update is not None
            apply_devices(conn, [update])

    def pod_listed(self, name: str) -> None:
        """The pod's rows as the tracker writes them, its GPU not (yet) reported by an
        agent."""
        with self.engine.begin() as conn:
            insert_rows(conn, schema.gpu_pods, [pod_row(name, "node-a")])
            insert_rows(
                conn,
                schema.workload_pod_references,
                [
                    {
                        "cluster": "local",
                        "workload_uid": "uid-pt-bert",
                        "pod_uid": f"uid-{name}",
                        "created_at": NOW,
                    }
                ],
            )

    def counted(self) -> dict[str, int]:
        return dict(self.indexer.node_refreshes)


def gpu_series(index: int) -> list[tuple[dict[str, str], list[tuple[float, int]]]]:
    at = int(NOW.timestamp() * 1000) + 15_000
    return [
        (
            {"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": "node-a", "UUID": f"GPU-{index}"},
            [(float(index), at)],
        )
    ]


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "recorder.db")
    yield c
    c.engine.dispose()


def test_a_miss_reads_only_its_nodes_rows_once_a_second(cluster: Cluster) -> None:
    cfg = config.load(env={}).recorder.remote_write
    r = Relabeler(cfg, cluster.indexer)
    cluster.indexer.refresh()
    cluster.pod_starts("bert-worker-1", 1)
    cluster.statements.clear()
    out = r.v1(request(gpu_series(1)))
    ((labels, samples),) = written(out.body)
    assert (labels["pod_uid"], labels["workload_uid"], samples) == (
        "uid-bert-worker-1",
        "uid-pt-bert",
        gpu_series(1)[0][1],
    )
    assert out.misses == {"found": 1, "not_found": 0, "throttled": 0}
    assert cluster.counted() == {"changed": 1, "unchanged": 0, "failed": 0}
    # its devices, their holder changes, its RDMA opens; the pods on it (a holder was new),
    # their workloads; each of node-a's rows only
    tables = [
        "node_devices",
        "device_changelog",
        "node_events",
        "gpu_pods",
        "workload_pod_references",
        "gpu_workloads",
    ]
    assert [next(t for t in tables if f"FROM {t}" in s) for s in cluster.statements] == tables
    assert all(".node = ?" in s.split(") AS ", 1)[1] for s in cluster.statements[:4])
    # a GPU the node does not have, within the second: not read; a second later, read (no
    # pod read: every holder it names is known)
    cluster.statements.clear()
    idle = [
        (
            {"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": "node-a", "UUID": "GPU-7"},
            [(0.0, int(NOW.timestamp() * 1000))],
        )
    ]
    assert r.v1(request(idle)).misses == {"found": 0, "not_found": 0, "throttled": 1}
    assert cluster.statements == []
    cluster.seconds += 1.0
    assert r.v1(request(idle)).misses == {"found": 0, "not_found": 1, "throttled": 0}
    assert cluster.counted() == {"changed": 1, "unchanged": 1, "failed": 0}
    assert len(cluster.statements) == 3 and "FROM gpu_pods" not in "".join(cluster.statements)


@pytest.mark.parametrize("uuid", ["", "GPU-99"])
def test_a_miss_finds_a_listed_pod_its_series_names_as_the_full_read_does(
    cluster: Cluster, uuid: str
) -> None:
    """dcgm-exporter's series naming its node (Hostname), the namespace and a GPU pod the
    service lists (with or without a GPU UUID no agent reported): its first post reads
    the node's entries again and finds the pod, as the next full read would; the three
    posts a second apart after it are copied from the maps, not missed again."""
    cfg = config.load(env={}).recorder.remote_write
    r = Relabeler(cfg, cluster.indexer)
    cluster.indexer.refresh()
    cluster.pod_listed("bert-worker-5")  # after the full read
    labels = {
        "__name__": "DCGM_FI_DEV_GPU_UTIL",
        "Hostname": "node-a",
        "gpu": "7",
        "namespace": "ml",
        "pod": "bert-worker-5",
        **({"UUID": uuid} if uuid else {}),
    }
    at = int(NOW.timestamp() * 1000)
    copied = []
    for post in range(4):
        out = r.v1(request([(labels, [(50.0 + post, at + 1000 * post)])]))
        copied.append([(x["pod_uid"], x["workload_uid"], s) for x, s in written(out.body)])
        if post == 0:
            assert out.misses == {"found": 1, "not_found": 0, "throttled": 0}
        else:
            assert out.misses == {"found": 0, "not_found": 0, "throttled": 0}
        cluster.seconds += 1.0
    assert copied == [
        [("uid-bert-worker-5", "uid-pt-bert", [(50.0 + i, at + 1000 * i)])] for i in range(4)
    ]
    assert cluster.counted() == {"changed": 1, "unchanged": 0, "failed": 0}
    # what the full read finds, the miss found: the next full read changes nothing
    found = cluster.indexer.index
    assert cluster.indexer.refresh().pods == found.pods


def test_a_holder_without_a_pod_row_is_sought_once_until_the_next_full_read(
    cluster: Cluster,
) -> None:
    cluster.indexer.refresh()
    cluster.pod_starts("bert-worker-1", 1, tracked=False)  # (the tracker has not written it)
    for i in range(3):
        cluster.statements.clear()
        assert cluster.indexer.look_again("node-a")[0]
        cluster.seconds += 1.0
        assert sum(1 for s in cluster.statements if "FROM gpu_pods" in s) == (i == 0)
    cluster.indexer.refresh()
    cluster.statements.clear()
    cluster.indexer.look_again("node-a")
    assert sum(1 for s in cluster.statements if "FROM gpu_pods" in s) == 1


def test_a_node_read_during_a_full_read_outlives_it(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The full read began before the pod's rows were written; a miss read its node after:
    what the node read found stays when the full read's maps replace the maps (and their
    generation moves, so the series read against the node's entries are read again)."""
    idx0 = cluster.indexer.refresh()
    real_build = index_module.build

    def build_then_a_miss(*args: Any) -> Index:
        idx = real_build(*args)  # without bert-worker-1
        cluster.pod_starts("bert-worker-1", 1)
        cluster.seconds += 0.5
        read, new = cluster.indexer.look_again("node-a")
        assert read and "uid-bert-worker-1" in new.pods
        return idx

    monkeypatch.setattr(index_module, "build", build_then_a_miss)
    cluster.seconds += 1.0
    idx = cluster.indexer.refresh()
    assert cluster.indexer.index is idx
    assert idx.held("node-a", "0000:01:00.0", 0) == ["uid-bert-worker-1"]
    assert idx.pods["uid-bert-worker-1"].workloads == BERT
    assert idx.generation == idx0.generation + 1
    # and the node read that began before a full read does not replace its maps
    monkeypatch.setattr(index_module, "build", real_build)
    real_read = index_module.read_node

    def read_then_a_full_read(*args: Any) -> Any:
        entries = real_read(*args)
        cluster.seconds += 0.5
        cluster.indexer.refresh()
        return entries

    monkeypatch.setattr(index_module, "read_node", read_then_a_full_read)
    cluster.seconds += 1.0
    cluster.pod_starts("bert-worker-2", 2)
    read, new = cluster.indexer.look_again("node-a")
    assert read and new is cluster.indexer.index and "uid-bert-worker-2" in new.pods
    assert cluster.counted() == {"changed": 1, "unchanged": 1, "failed": 0}


def test_a_node_the_maps_do_not_know_is_read_by_its_address(cluster: Cluster) -> None:
    cluster.indexer.refresh()
    with cluster.engine.begin() as conn:
        insert_rows(conn, schema.nodes, [node_row("node-b", "10.0.0.8")])
    cfg = config.load(env={}).recorder.remote_write
    r = Relabeler(cfg, cluster.indexer)
    series = [
        ({"__name__": "up", "instance": "10.0.0.9:9100"}, [(1.0, 1)]),  # names nothing
        ({"__name__": "x", "instance": "10.0.0.8:9400", "gpu": "0"}, [(1.0, 1)]),
    ]
    out = r.v1(request(series))
    assert out.misses == {"found": 0, "not_found": 1, "throttled": 0}  # known now, no GPU yet
    assert "node-b" in cluster.indexer.index.nodes
    assert cluster.indexer.index.stamps == {"node-b": 1, "10.0.0.8": 1}


def test_a_miss_while_its_node_is_read_waits_for_that_read(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prometheus's shards send a node's series at once: the second shard's miss takes the
    first one's read, not a throttled miss."""
    cluster.indexer.refresh()
    cluster.pod_starts("bert-worker-1", 1)
    started, go = threading.Event(), threading.Event()
    real_read = index_module.read_node

    def slow_read(*args: Any) -> Any:
        started.set()
        assert go.wait(10)
        return real_read(*args)

    monkeypatch.setattr(index_module, "read_node", slow_read)
    first: list[tuple[bool, Index]] = []
    reader = threading.Thread(target=lambda: first.append(cluster.indexer.look_again("node-a")))
    reader.start()
    assert started.wait(10)
    second: list[tuple[bool, Index]] = []
    waiter = threading.Thread(target=lambda: second.append(cluster.indexer.look_again("node-a")))
    waiter.start()

    def waiting() -> bool:  # the waiter blocked in look_again, on the read in flight
        frame = sys._current_frames().get(waiter.ident or 0)
        codes = []
        while frame is not None:
            codes.append(frame.f_code.co_name)
            frame = frame.f_back
        return "look_again" in codes and "wait" in codes

    wait_for(waiting, "the second miss waiting for the read in flight")
    assert second == []
    go.set()
    reader.join(10)
    waiter.join(10)
    ((read, idx),) = second
    assert read and idx is first[0][1] and "uid-bert-worker-1" in idx.pods
    assert cluster.counted() == {"changed": 1, "unchanged": 0, "failed": 0}
