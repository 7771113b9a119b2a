"""Remote write without a service: which requests are taken, how a series finds its pod
(by each default device label rule, with the exporters' real label sets; by its pod
labels; as of its samples' time), the copies' labels and samples, proxy mode, and 2.0's
symbols."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from lens_ebpf.recorder import config
from lens_ebpf.recorder.gen import remote_write_v1_pb2 as pb1
from lens_ebpf.recorder.gen import remote_write_v2_pb2 as pb2
from lens_ebpf.recorder.remote_write import wire
from lens_ebpf.recorder.remote_write.index import Index, Pod, bdf
from lens_ebpf.recorder.remote_write.relabel import Relabeler

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
    def __init__(self, idx: Index) -> None:
        self.index = idx


def index() -> Index:
    idx = Index(generation=1)
    idx.nodes = {"i-030791dc5a37cd257", "tw038", "node-a"}
    idx.addresses = {"10.0.0.7": "node-a"}
    idx.gpus = {
        "i-030791dc5a37cd257": {("index", "0"): "0000:31:00.0",
                                ("uuid", "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"):
                                    "0000:31:00.0",
                                ("bdf", "0000:31:00.0"): "0000:31:00.0"},
        "tw038": {("index", "2"): "0000:15:00.0", ("serial", "692409005408"): "0000:15:00.0",
                  ("uuid", "ccff74a1-0000-1000-80e0-c6d49f5b0d86"): "0000:15:00.0"},
        "node-a": {("index", "3"): "0000:c1:00.0", ("index", "0"): "0000:01:00.0"},
    }  # fmt: skip
    idx.holders = {
        ("i-030791dc5a37cd257", "0000:31:00.0"): [(-math.inf, math.inf, "uid-w0")],
        ("tw038", "0000:15:00.0"): [(-math.inf, math.inf, "uid-w1")],
        ("node-a", "0000:c1:00.0"): [(-math.inf, CHANGED, "uid-w0"),
                                     (CHANGED, math.inf, "uid-w1")],
        ("node-a", "mlx5_0"): [(0.0, math.inf, "uid-w2")],
        ("node-a", "mlx5_1"): [(0.0, math.inf, "uid-w2"), (0.0, math.inf, "uid-w3")],
    }  # fmt: skip
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
        out.append(({lb.name: lb.value for lb in ts.labels},
                    [(s.value, s.timestamp) for s in ts.samples]))  # fmt: skip
    return out


def test_every_default_rule_finds_the_pod_on_the_exporters_real_series() -> None:
    r = relabeler()
    dcgm = exposition("dcgm-exporter.prom")
    amd = exposition("amd-device-metrics-exporter.prom")
    lens = [{"__name__": "gpu_utilization", "gpu_id": "3", "vendor": "amd", "node": "node-a"},
            {"__name__": "hw_gpu_utilization_percent", "gpu_index": "0", "node": "10.0.0.7:9470",
             "gpu_uuid": "not-known"},  # instance-style node (an address), index 0: nobody
            {"__name__": "lens_rdma_port_transmit_bytes_total", "device": "mlx5_0", "port": "1",
             "node": "node-a"}]  # fmt: skip
    series = [(lb, [(7.0, 1_700_000_000_000)]) for lb in dcgm + amd + lens]
    out = r.v1(request(series))
    got = written(out.body)
    # dcgm's seven (UUID), AMD's one (gpu_uuid), lens-ebpf's GPU 3 and RDMA port: each a copy
    assert len(got) == len(dcgm) + 1 + 2
    first = got[0][0]
    assert first == {**dcgm[0], "__name__": "workload_DCGM_FI_DEV_SM_CLOCK",
                     "job": "lens-ebpf-recorder", "pod_name": "bert-worker-0",
                     "pod_uid": "uid-w0", "workload_name": "bert",
                     "workload_uid": "uid-pt-bert"}  # fmt: skip
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
        ("web-7d9f", "uid-rs", "uid-web"), ("web", "uid-dep", "uid-web")]  # fmt: skip
    # uid beside the name (kube-state-metrics), and a name no other namespace has
    r = relabeler()
    for extra in ({"pod_name": "web-7d9f-x", "uid": "uid-web"}, {"exported_pod": "web-7d9f-x"}):
        got = written(r.v1(request([({"__name__": "kube_pod_info", **extra}, [(1, 1)])])).body)
        assert {x["pod_uid"] for x, _ in got} == {"uid-web"}, extra
    out = r.v1(request([({"__name__": "x", "pod": "bare", "namespace": "ml"}, [(1, 1)]),
                        ({"__name__": "x", "pod": "nobody", "namespace": "ml"}, [(1, 1)]),
                        ({"__name__": "up", "job": "node"}, [(1, 1), (1, 2)])]))  # fmt: skip
    assert out.body == b"" and out.series == 0
    assert out.counts == {"copied": 0, "no_pod": 3, "no_workload": 1, "rejected": 0}


def test_a_gpu_that_changed_holders_copies_each_sample_to_its_holder_then() -> None:
    lb = {"__name__": "gpu_utilization", "gpu_id": "3", "node": "node-a"}
    samples = [(10.0, int(CHANGED) - 15000), (20.0, int(CHANGED)), (30.0, int(CHANGED) + 15000)]
    got = written(relabeler().v1(request([(lb, samples)])).body)
    assert [(x["pod_name"], s) for x, s in got] == [
        ("bert-worker-0", samples[:1]), ("bert-worker-1", samples[1:])]  # fmt: skip
    # a shared RDMA device (two pods' queue pairs): no one pod, counted
    out = relabeler().v1(request([({"__name__": "x", "device": "mlx5_1", "node": "node-a"},
                                   [(1.0, 5)])]))  # fmt: skip
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
    assert originals[0] == {**dcgm, "namespace": "ml", "pod": "bert-worker-0",
                            "workload_kind": "PyTorchJob", "workload": "bert"}  # fmt: skip
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
        return {sym[t.labels_refs[i]]: sym[t.labels_refs[i + 1]]
                for i in range(0, len(t.labels_refs), 2)}  # fmt: skip

    copy, proxied = got.timeseries
    assert labels(copy) == {"__name__": "workload_DCGM_FI_DEV_GPU_UTIL", "Hostname":
                            "i-030791dc5a37cd257", "gpu": "0", "job": "lens-ebpf-recorder",
                            "pod_name": "bert-worker-0", "pod_uid": "uid-w0",
                            "workload_name": "bert", "workload_uid": "uid-pt-bert"}  # fmt: skip
    assert labels(proxied)["pod"] == "bert-worker-0"
    for t in (copy, proxied):
        assert [(s.value, s.timestamp) for s in t.samples] == [(42.0, 1000)]
        assert [sym[i] for i in t.exemplars[0].labels_refs] == ["trace_id", "abc"]
        assert sym[t.metadata.help_ref] == "help text"
    assert (out.written.samples, out.written.exemplars) == (1, 1)
    past = pb2.TimeSeries(labels_refs=[5, 6], samples=[pb2.Sample()])
    bad = pb2.Request(symbols=[""], timeseries=[past])
    with pytest.raises(wire.WireError) as err:
        relabeler().v2(bad.SerializeToString())
    assert err.value.status == 400


def test_which_requests_are_taken() -> None:
    v1 = {"content-type": "application/x-protobuf", "content-encoding": "snappy",
          "x-prometheus-remote-write-version": "0.1.0"}  # fmt: skip
    assert wire.version(v1) == wire.V1
    assert wire.version({**v1, "x-prometheus-remote-write-version": ""}) == wire.V1
    v2 = {
        **v1,
        "content-type": "application/x-protobuf;proto=io.prometheus.write.v2.Request",
        "x-prometheus-remote-write-version": "2.0.0",
    }
    assert wire.version(v2) == wire.V2
    for bad, why in (({**v1, "content-type": "application/json"}, "Content-Type"),
                     ({**v1, "content-type": "application/x-protobuf;proto=x.Y"}, "proto=x.Y"),
                     ({**v1, "content-encoding": "gzip"}, "snappy"),
                     ({**v1, "x-prometheus-remote-write-version": "9.9.9"}, "9.9.9")):  # fmt: skip
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
