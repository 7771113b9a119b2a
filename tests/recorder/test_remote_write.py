"""Remote write through the recorder, end to end: a real Prometheus scrapes other
exporters' real exposition (dcgm-exporter's, AMD's device-metrics-exporter's) and
remote-writes to the service, which writes each GPU pod's series on to a second real
Prometheus (its remote write receiver on) as the workload_ copies Primus-Lens's dashboards
query; in proxy mode every series goes on. The receiver stopped for a minute loses
nothing. Bad requests get their answers; a receiver's failures reach the sender."""

from __future__ import annotations

import http.server
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from lens_ebpf.protocol.gen import lens_pb2 as pb
from lens_ebpf.recorder.gen import remote_write_v1_pb2 as pb1
from lens_ebpf.recorder.gen import remote_write_v2_pb2 as pb2
from lens_ebpf.recorder.remote_write import wire
from tests.conftest import hang_guard, wait_for
from tests.k8slab import FakeApiServer, eventually
from tests.recorder.objects import NS, U, gpu_pod, state, template, workload
from tests.recorder.test_cluster_api import node
from tests.recorder.test_node_events import report
from tests.recorder.test_training import get, metric

FIX = Path(__file__).parent.parent / "fixtures" / "remote_write"
NVIDIA, AMD, OTHER = "i-030791dc5a37cd257", "tw038", "gpu-3"  # the exporters' host names
WORKERS = {"bert-worker-0": NVIDIA, "bert-worker-1": AMD, "bert-worker-2": OTHER}


class Exporter:
    """Serves an exposition text on /metrics, as an exporter does (text: what it serves
    now, a test may change it)."""

    def __init__(self, text: str) -> None:
        self.text = text
        me = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body = me.text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.target = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()  # refused from now on, as a receiver that is down


class Receiver:
    """A remote write receiver that answers what the test says and keeps what it got."""

    def __init__(self) -> None:
        self.status = 204
        self.got: list[tuple[dict[str, str], bytes]] = []
        rec = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                rec.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(rec.status)
                if rec.status == 429:
                    self.send_header("Retry-After", "7")
                self.send_header("Content-Length", "4")
                self.end_headers()
                self.wfile.write(b"nope" if rec.status >= 300 else b"okay")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v1/write"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()  # refused from now on, as a receiver that is down


def exposition() -> str:
    """The exporters' lines: dcgm-exporter's and AMD's as served, and dcgm-exporter's
    Kubernetes quick start for a GPU the service does not know, its pod labels filled as
    dcgm-exporter fills them for a pod that holds the GPU."""
    kube = (
        (FIX / "dcgm-exporter-kubernetes.prom")
        .read_text()
        .replace('namespace="",pod=""', f'namespace="{NS}",pod="bert-worker-2"')
    )
    return (
        (FIX / "dcgm-exporter.prom").read_text()
        + (FIX / "amd-device-metrics-exporter.prom").read_text()
        + kube
    )


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, value = line.rsplit(" ", 1)
        name, _, body = head.partition("{")
        labels = {}
        for part in body.rstrip("}").split('",'):
            k, _, v = part.strip().partition("=")
            labels[k.strip()] = v.strip().strip('"')
        out.append((name, labels, float(value)))
    return out


def bert(api: FakeApiServer) -> None:
    spec = {
        "pytorchReplicaSpecs": {
            "Worker": {"replicas": 3, "template": template("nvidia.com/gpu", 1)}
        }
    }
    api.put("pytorchjobs", workload("bert", spec, {}))
    for i, (pod, host) in enumerate(WORKERS.items()):
        api.put("nodes", node(host, "True", {"nvidia.com/gpu": "8"}, f"10.1.0.{i + 1}"))
        api.put("pods", state(gpu_pod(pod, "bert", "nvidia.com/gpu", 1, host), "Running", True))


def devices(app: Any) -> None:
    """Each node's agent reports its GPU, held by its worker (as the kubelet gave it)."""
    nv = pb.DeviceChange(
        device_kind="gpu",
        vendor="nvidia",
        bdf="0000:31:00.0",
        slot="0000:31:00.0",
        index=0,
        key="GPU-c2f76b33-7953-256e-8f33-1343419b1a1c",
        uuid="GPU-c2f76b33-7953-256e-8f33-1343419b1a1c",
        model="NVIDIA L4",
        holder=f"{NS}/bert-worker-0",
    )
    uuid = "ccff74a1-0000-1000-80e0-c6d49f5b0d86"
    amd = pb.DeviceChange(
        device_kind="gpu",
        vendor="amd",
        bdf="0000:15:00.0",
        slot="0000:15:00.0",
        index=2,
        key=uuid,
        uuid=uuid,
        serial="692409005408",
        model="AMD Instinct MI300X OAM",
        holder=f"{NS}/bert-worker-1",
    )
    for host, gpu in ((NVIDIA, nv), (AMD, amd)):
        ev = pb.Event(
            seq=1,
            ts_unix_nano=time.time_ns(),
            node_name=host,
            device_inventory=pb.DeviceInventory(devices=[gpu]),
        )
        assert report(app.collect_port, host, [ev]) == [0, 1]
    assert app.writer.flush(10)


def started(api: FakeApiServer, recorder_app: Any, url: str, **settings: Any) -> Any:
    bert(api)
    app = recorder_app(url, remote_write__cache_seconds=3600, **settings)
    from tests.recorder.conftest import rows

    eventually(lambda: sum(r["running"] for r in rows(url, "gpu_pods")) == 3, timeout=15)
    devices(app)
    idx = app.remote_write.indexer.refresh()
    assert len(idx.pods) == 3 and idx.holders
    return app


def test_other_exporters_series_become_workload_series_in_a_real_prometheus(
    api: FakeApiServer, recorder_app: Any, tmp_path: Path
) -> None:
    """(SQLite alone: a minute of the receiver down is this test's own time; the maps on
    PostgreSQL are the next test's.)"""
    from tests.promserver import Prometheus, available

    if available():
        pytest.skip(available())
    token = tmp_path / "token"
    token.write_text("s3cret")
    receiver = Prometheus([], flags=["--web.enable-remote-write-receiver"])
    exporter = Exporter(exposition())
    sender = None
    try:
        app = started(
            api,
            recorder_app,
            f"sqlite:///{tmp_path / 'r.db'}",
            ingest__token_file=str(token),
            remote_write__url=f"{receiver.base}/api/v1/write",
        )
        sender = Prometheus(
            [exporter.target],
            remote_write=[
                {
                    "url": f"http://127.0.0.1:{app.http.port}/prometheus",
                    "authorization": {"credentials_file": str(token)},
                    "queue_config": {
                        "batch_send_deadline": "1s",
                        "min_backoff": "100ms",
                        "max_backoff": "2s",
                    },
                }
            ],
        )
        want = samples(exposition())
        # every series of a GPU pod, as its workload_ copy, value exact
        for name, labels, value in want:
            pod = (
                "bert-worker-2"
                if labels.get("pod")
                else "bert-worker-0"
                if labels.get("Hostname")
                else "bert-worker-1"
            )
            expr = f'workload_{name}{{workload_uid="{U["bert"]}",pod_name="{pod}"}}'
            got = receiver.wait_value(expr, lambda r: len(r) == 1, timeout=60)[0]["metric"]
            assert float(receiver.query(expr)["result"][0]["value"][1]) == value, expr
            assert (got["workload_name"], got["job"], got["pod_uid"]) == (
                "bert",
                "lens-ebpf-recorder",
                f"uid-{pod}",
            )
            for k, v in labels.items():  # theirs kept (an empty one is no label)
                assert got.get(k, "") == v, (expr, k)
        # nothing else is copied (up, scrape_*: no pod), and no original goes on
        every = receiver.query('count by (__name__) ({__name__=~".+"})')["result"]
        names = {r["metric"]["__name__"] for r in every}
        assert names == {f"workload_{n}" for n, _, _ in want}
        assert metric(app, 'lens_recorder_remote_write_samples_total{result="no_pod"}') > 0

        # the receiver stopped for a minute: the sender hears 503, retries, loses nothing
        before = time.time()
        receiver.pause()
        wait_for(
            lambda: (
                metric(
                    app,
                    "lens_recorder_remote_write_downstream_errors_total" '{reason="unreachable"}',
                )
                or 0
            )
            > 0,
            "the service saw the receiver down",
            30,
        )
        time.sleep(60)
        receiver.start()
        span = int(time.time() - before) + 120
        sel = f'{{Hostname="{NVIDIA}",__name__="DCGM_FI_DEV_GPU_UTIL"}}'
        copied = '{pod_name="bert-worker-0",__name__="workload_DCGM_FI_DEV_GPU_UTIL"}'

        def caught_up() -> bool:
            at = time.time() - 5  # what the sender has sent by now
            sent = sender.query(f"count_over_time({sel}[{span}s] @ {at:.3f})")["result"]
            got = receiver.query(f"count_over_time({copied}[{span}s] @ {at:.3f})")["result"]
            return bool(sent and got) and sent[0]["value"][1] == got[0]["value"][1]

        wait_for(caught_up, "the receiver has every sample the sender scraped", 180, every=2)
        own = requests.get(sender.base + "/metrics", timeout=hang_guard(5)).text
        said = {
            line.split("{")[0]: float(line.rsplit(" ", 1)[1])
            for line in own.splitlines()
            if line.startswith("prometheus_remote_storage_samples_")
        }
        # the sender's own count: none failed or dropped, some retried (the minute down)
        assert said["prometheus_remote_storage_samples_failed_total"] == 0, said
        assert said["prometheus_remote_storage_samples_dropped_total"] == 0, said
        assert said["prometheus_remote_storage_samples_retried_total"] > 0, said
        # counted on both sides: what the service says it copied is what the receiver
        # holds, but for a retried batch that had reached it already (delivery is at least
        # once: a request the receiver took after the sender gave up on it, around the
        # minute down, comes again and the receiver keeps its samples once; a run here
        # counted 670 copied for 660 held): never fewer, and at most what the sender retried
        sender.pause()  # its last batches flushed on the way out
        assert app.writer.flush(5)
        held = sum(
            float(r["value"][1])
            for n in names
            for r in receiver.query(f"count_over_time({n}[1h])")["result"]
        )
        copied_n = metric(app, 'lens_recorder_remote_write_samples_total{result="copied"}')
        retried = said["prometheus_remote_storage_samples_retried_total"]
        assert held <= copied_n <= held + retried, (held, copied_n, retried)
        # the maps the copies were made by, as Primus-Lens serves them
        cache = get(app, f"/pods/cache?node={NVIDIA}")
        assert cache["cache"] == {
            NVIDIA: {
                "UUID": {
                    "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c": [
                        "bert-worker-0",
                        "uid-bert-worker-0",
                    ]
                },
                "gpu_uuid": {
                    "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c": [
                        "bert-worker-0",
                        "uid-bert-worker-0",
                    ]
                },
                "pci_bus_id": {"0000:31:00.0": ["bert-worker-0", "uid-bert-worker-0"]},
                **{
                    k: {"0": ["bert-worker-0", "uid-bert-worker-0"]}
                    for k in ("gpu_id", "gpu", "gpu_index", "asic")
                },
            }
        }
        assert get(app, "/v1/pods/workload/cache")["cache"] == {
            p: [["bert", U["bert"]]] for p in WORKERS
        }
    finally:
        if sender is not None:
            sender.stop()
        receiver.stop()
        exporter.stop()


def test_proxy_mode_forwards_every_series(
    api: FakeApiServer, recorder_app: Any, tmp_path: Path
) -> None:
    from tests.promserver import Prometheus, available

    if available():
        pytest.skip(available())
    receiver = Prometheus([], flags=["--web.enable-remote-write-receiver"])
    exporter = Exporter(exposition())
    sender = None
    try:
        app = started(
            api,
            recorder_app,
            f"sqlite:///{tmp_path / 'r.db'}",
            remote_write__url=f"{receiver.base}/api/v1/write",
            remote_write__mode="proxy",
        )
        sender = Prometheus(
            [exporter.target],
            remote_write=[
                {
                    "url": f"http://127.0.0.1:{app.http.port}/v1/prometheus",
                    "queue_config": {"batch_send_deadline": "1s"},
                }
            ],
        )
        for name, labels, value in samples(exposition()):
            key = "UUID" if "UUID" in labels else "gpu_uuid"
            sel = f'{name}{{job="lens-ebpf",{key}="{labels[key]}"}}'
            r = receiver.wait_value(sel, lambda r: len(r) >= 1, 60)
            want = (
                {"bert-worker-2"}
                if labels.get("pod")
                else {"bert-worker-0"}
                if labels.get("Hostname")
                else {"bert-worker-1"}
            )
            assert {x["metric"].get("pod") for x in r} == want, name
            assert {x["metric"].get("workload") for x in r} == {"bert"}
            assert {float(x["value"][1]) for x in r} == {value}
        # and what belongs to no pod goes on as it came
        up = receiver.wait_value('up{job="lens-ebpf"}', lambda r: len(r) == 1, 60)
        assert "pod" not in up[0]["metric"]
        receiver.wait_value(
            'workload_gpu_gfx_activity{workload_name="bert"}', lambda r: len(r) == 1, 60
        )
    finally:
        if sender is not None:
            sender.stop()
        receiver.stop()
        exporter.stop()


def write_request() -> bytes:
    req = pb1.WriteRequest()
    ts = req.timeseries.add()
    for k, v in sorted(
        {
            "__name__": "DCGM_FI_DEV_GPU_UTIL",
            "Hostname": NVIDIA,
            "UUID": "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c",
        }.items()
    ):
        ts.labels.add(name=k, value=v)
    ts.samples.add(value=97.0, timestamp=int(time.time() * 1000))
    return req.SerializeToString()


V1 = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}


def test_bad_requests_and_a_failing_receiver_get_their_answers(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    receiver = Receiver()
    try:
        app = started(
            api,
            recorder_app,
            db_url,
            remote_write__url=receiver.url,
            remote_write__max_body_bytes=4096,
        )
        url = f"http://127.0.0.1:{app.http.port}/prometheus"

        def send(body: bytes, headers: dict[str, str] | None = None) -> requests.Response:
            return requests.post(
                url,
                data=body,
                headers=headers if headers is not None else V1,
                timeout=hang_guard(10),
            )

        good = wire.snappy(write_request())
        r = send(good)
        assert r.status_code == 204, r.text
        ((headers, body),) = receiver.got
        assert headers["content-encoding"] == "snappy"
        assert headers["x-prometheus-remote-write-version"] == "0.1.0"
        (copy,) = pb1.WriteRequest.FromString(wire.unsnappy(body, 1 << 20)).timeseries
        assert {lb.name: lb.value for lb in copy.labels}["workload_uid"] == U["bert"]
        cases = [
            (b"not snappy at all", V1, 400, "not snappy"),
            (wire.snappy(b"\x0a\xff\xff\xff"), V1, 400, "not a prometheus.WriteRequest"),
            (good, {**V1, "X-Prometheus-Remote-Write-Version": "9.0.0"}, 415, "9.0.0"),
            (good, {**V1, "Content-Encoding": "gzip"}, 415, "snappy"),
            (good, {**V1, "Content-Type": "application/json"}, 415, "Content-Type"),
            (wire.snappy(b"\x0a" + b"\x00" * 9000), V1, 413, "once unpacked"),
        ]
        for data, headers, status, why in cases:
            r = send(data, headers)
            assert r.status_code == status and why in r.json()["meta"]["message"], (why, r.text)
        assert send(b"x" * 5000).status_code == 413  # over max_body_bytes as sent
        # (a Content-Type other than protobuf is refused on the head, before the receiver)
        for reason, n in (("bad_body", 2), ("unsupported", 2), ("too_large", 1)):
            assert (
                metric(app, f'lens_recorder_remote_write_refused_total{{reason="{reason}"}}') == n
            )
        # the receiver's answers reach the sender: 429 (with its Retry-After), 503, 400
        for status, heard in ((429, 429), (500, 503), (503, 503), (400, 400)):
            receiver.status = status
            r = send(good)
            assert r.status_code == heard, (status, r.text)
            if status == 429:
                assert r.headers["Retry-After"] == "7"
        assert metric(app, 'lens_recorder_remote_write_samples_total{result="rejected"}') == 1
        for reason, n in (("429", 1), ("5xx", 2), ("4xx", 1)):
            assert (
                metric(
                    app,
                    "lens_recorder_remote_write_downstream_errors_total" f'{{reason="{reason}"}}',
                )
                == n
            )
        receiver.stop()
        r = send(good)
        assert r.status_code == 503 and "did not answer" in r.json()["meta"]["message"]
        # remote write 2.0 goes on as 2.0, and says what it wrote
        receiver = Receiver()
        app.remote_write.forwarder.cfg = app.remote_write.cfg.model_copy(
            update={"url": receiver.url}
        )
        req = pb2.Request(
            symbols=[
                "",
                "__name__",
                "DCGM_FI_DEV_GPU_UTIL",
                "Hostname",
                NVIDIA,
                "UUID",
                "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c",
            ]
        )
        ts = req.timeseries.add(labels_refs=[1, 2, 3, 4, 5, 6])
        ts.samples.add(value=5.0, timestamp=int(time.time() * 1000))
        v2 = {
            **V1,
            "Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request",
            "X-Prometheus-Remote-Write-Version": "2.0.0",
        }
        r = send(wire.snappy(req.SerializeToString()), v2)
        assert r.status_code == 204, r.text
        assert r.headers["X-Prometheus-Remote-Write-Samples-Written"] == "1"
        ((headers, body),) = receiver.got
        assert headers["content-type"] == v2["Content-Type"]
        got = pb2.Request.FromString(wire.unsnappy(body, 1 << 20))
        assert "workload_DCGM_FI_DEV_GPU_UTIL" in got.symbols
    finally:
        receiver.stop()


def test_without_a_receiver_remote_write_says_so(
    api: FakeApiServer, recorder_app: Any, tmp_path: Path
) -> None:
    app = recorder_app(f"sqlite:///{tmp_path / 'r.db'}")
    r = requests.post(
        f"http://127.0.0.1:{app.http.port}/prometheus",
        data=wire.snappy(write_request()),
        headers=V1,
        timeout=hang_guard(10),
    )
    assert r.status_code == 503 and "remote_write.url is not set" in r.json()["meta"]["message"]
    assert get(app, "/pods/cache")["cache"] == {}


def new_gpu(index: int, holder: str) -> pb.DeviceChange:
    """Another NVIDIA GPU as its node's agent reports it once the kubelet gave it a pod."""
    uuid = f"GPU-c2f76b33-7953-256e-8f33-1343419b1a{index:02x}"
    slot = f"0000:{0x31 + index:02x}:00.0"
    return pb.DeviceChange(
        device_kind="gpu",
        vendor="nvidia",
        change="appeared",
        bdf=slot,
        slot=slot,
        index=index,
        key=uuid,
        uuid=uuid,
        model="NVIDIA L4",
        holder=f"{NS}/{holder}",
    )


def test_a_new_pods_first_sample_is_copied(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    """A pod that starts after the maps were read (an hour between full reads here) has
    its first sample copied: the miss reads its node's entries again, at most once a
    second per node; a node the maps do not know counts as a miss too."""
    from tests.promserver import Prometheus, available
    from tests.recorder.conftest import rows

    if available():
        pytest.skip(available())
    receiver = Prometheus([], flags=["--web.enable-remote-write-receiver"])
    try:
        app = started(api, recorder_app, db_url, remote_write__url=f"{receiver.base}/api/v1/write")
        ticks = [time.monotonic()]  # (after the maps' full read)
        app.remote_write.indexer.monotonic = lambda: ticks[0]  # the second, in the test's hand
        url = f"http://127.0.0.1:{app.http.port}/prometheus"
        seqs = {NVIDIA: 2, "gpu-new": 1}  # each agent's next event (devices() sent NVIDIA's 1)

        def pod_starts(name: str, host: str, index: int) -> None:
            """Its rows as the tracker writes them, then its GPU as its node's agent
            reports it."""
            api.put(
                "pods", state(gpu_pod(name, "bert", "nvidia.com/gpu", 1, host), "Running", True)
            )
            eventually(
                lambda: f"uid-{name}"
                in {r["pod_uid"] for r in rows(db_url, "workload_pod_references")},
                timeout=15,
            )
            ev = pb.Event(
                seq=seqs[host],
                ts_unix_nano=time.time_ns(),
                node_name=host,
                device_change=new_gpu(index, name),
            )
            seqs[host] += 1
            assert report(app.collect_port, host, [ev])[-1] == ev.seq
            assert app.writer.flush(10)

        def send(labels: dict[str, str], value: float) -> int:
            req = pb1.WriteRequest()
            ts = req.timeseries.add()
            for k in sorted(labels):
                ts.labels.add(name=k, value=labels[k])
            at = int(time.time() * 1000)
            ts.samples.add(value=value, timestamp=at)
            r = requests.post(
                url, data=wire.snappy(req.SerializeToString()), headers=V1, timeout=hang_guard(10)
            )
            assert r.status_code == 204, r.text
            return at

        def dcgm(host: str, index: int) -> dict[str, str]:
            return {
                "__name__": "DCGM_FI_DEV_GPU_UTIL",
                "Hostname": host,
                "gpu": str(index),
                "UUID": new_gpu(index, "").uuid,
            }

        def copies(pod: str) -> list[dict[str, Any]]:
            expr = f'workload_DCGM_FI_DEV_GPU_UTIL{{pod_name="{pod}"}}'
            return receiver.query(f"{expr}[1h]")["result"]  # type: ignore[no-any-return]

        def counted(family: str, result: str) -> float | None:
            return metric(app, f'lens_recorder_remote_write_{family}_total{{result="{result}"}}')

        def copy_of(labels: dict[str, str], pod: str) -> dict[str, str]:
            return {
                **labels,
                "__name__": "workload_DCGM_FI_DEV_GPU_UTIL",
                "job": "lens-ebpf-recorder",
                "pod_name": pod,
                "pod_uid": f"uid-{pod}",
                "workload_name": "bert",
                "workload_uid": U["bert"],
            }

        # a pod starts on a GPU the maps know nothing of: its first sample is copied
        pod_starts("bert-worker-3", NVIDIA, 1)
        first = dcgm(NVIDIA, 1)
        at = send(first, 61.0)
        ((got,),) = [copies("bert-worker-3")]
        assert got["metric"] == copy_of(first, "bert-worker-3")
        assert got["values"] == [[at / 1000, "61"]]
        assert counted("node_refreshes", "changed") == 1
        assert counted("misses", "found") == 1

        # another within the same second: its node is not read again, no copy yet
        pod_starts("bert-worker-4", NVIDIA, 2)
        second = dcgm(NVIDIA, 2)
        send(second, 62.0)
        assert copies("bert-worker-4") == []
        assert (counted("node_refreshes", "changed"), counted("node_refreshes", "unchanged")) == (
            1,
            0,
        )
        assert counted("misses", "throttled") == 1
        assert metric(app, 'lens_recorder_remote_write_samples_total{result="no_pod"}') == 1
        # a second later it is
        ticks[0] += 1.0
        at = send(second, 63.0)
        ((got,),) = [copies("bert-worker-4")]
        assert got["metric"] == copy_of(second, "bert-worker-4")
        assert got["values"] == [[at / 1000, "63"]]
        assert counted("node_refreshes", "changed") == 2
        assert counted("misses", "found") == 2

        # a node the maps do not know, named by its address (instance): its first pod
        api.put("nodes", node("gpu-new", "True", {"nvidia.com/gpu": "8"}, "10.1.0.9"))
        eventually(lambda: "gpu-new" in {r["name"] for r in rows(db_url, "nodes")}, timeout=15)
        pod_starts("bert-worker-5", "gpu-new", 0)
        third = {**dcgm("gpu-new", 0), "instance": "10.1.0.9:9400"}
        del third["Hostname"]
        at = send(third, 64.0)
        ((got,),) = [copies("bert-worker-5")]
        assert got["metric"] == copy_of(third, "bert-worker-5")
        assert got["values"] == [[at / 1000, "64"]]
        assert counted("node_refreshes", "changed") == 3
        assert (
            counted("misses", "found"),
            counted("misses", "not_found"),
            counted("misses", "throttled"),
        ) == (3, 0, 1)
    finally:
        receiver.stop()
