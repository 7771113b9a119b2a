"""collectors.otlp without BPF: the requests the encoders write are the bytes
opentelemetry-proto writes for the same messages (built here with its classes, field by
field, from what the code is meant to send); series start and restart; resources name
the pods; the sender keeps the batch in hand and the newest of its queue through an
outage, counts what it dropped, and takes an endpoint's refusals and partial successes.
The agent in this process exports its own /metrics and a GPU fault."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
    KeyValueList,
)
from opentelemetry.proto.logs.v1 import logs_pb2 as lp
from opentelemetry.proto.metrics.v1 import metrics_pb2 as mp
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from lens_ebpf.agent import config
from lens_ebpf.agent.events import (
    WIRE_ATTRS,
    DeviceChange,
    DeviceInventory,
    Event,
    EventBus,
    FlowClosed,
    GpuFault,
    ProcessEvent,
)
from lens_ebpf.agent.metrics.cache import COUNTER, HISTOGRAM, MetricCache
from lens_ebpf.agent.otlp import exporter, semconv, wire
from lens_ebpf.agent.otlp.logs import LogsEncoder
from lens_ebpf.agent.otlp.metrics import MetricsEncoder, from_cache, from_prometheus
from lens_ebpf.core.settings import ConfigError
from tests.conftest import wait_for
from tests.otlplab import OtlpReceiver, attrs

NODE = semconv.node_attributes("node-a", "9.9")
SCOPE = InstrumentationScope(name="lens-ebpf", version="9.9")


def kvs(pairs: Any) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in pairs]


def any_value(v: Any) -> AnyValue:
    """What the code should make of a value, with the library's classes."""
    if isinstance(v, str):
        return AnyValue(string_value=v)
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    if isinstance(v, dict):
        return AnyValue(kvlist_value=KeyValueList(values=kvs(v.items())))
    if isinstance(v, Event):
        return any_value(v.to_dict())
    return AnyValue(array_value=ArrayValue(values=[any_value(x) for x in v]))


def resource(*more: tuple[str, str]) -> Resource:
    return Resource(attributes=kvs([*NODE, *more]))


POD_C = (("k8s.namespace.name", "team"), ("k8s.pod.name", "p-0"), ("k8s.container.name", "c"))
POD = (("k8s.namespace.name", "team"), ("k8s.pod.name", "p-0"))


def families() -> tuple[MetricCache, list[Metric]]:
    cache = MetricCache()
    cache.register("lens_x_sent_bytes_total", COUNTER, "Sent", ("direction", "raddr", "remote_pod"))
    cache.register(
        "lens_container_process_execs_total", COUNTER, "Execs", ("namespace", "pod", "container")
    )
    cache.register("lens_x_rtt_seconds", HISTOGRAM, "RTT", ("raddr",), buckets=(0.001, 0.01))
    cache.register("lens_x_empty_total", COUNTER, "No series", ())
    cache.inc("lens_x_sent_bytes_total", ("egress", "10.0.0.7", ""), 300)
    cache.inc("lens_container_process_execs_total", ("team", "p-0", "c"), 2)
    cache.inc("lens_container_process_execs_total", ("", "", ""), 1)
    cache.observe("lens_x_rtt_seconds", ("10.0.0.7",), [1, 0, 2], 0.5)
    temp = GaugeMetricFamily("hw_gpu_temperature_celsius", "Temp", labels=["gpu_index"])
    temp.add_metric(["0"], 41.5)
    faults = CounterMetricFamily(
        "lens_gpu_faults", "Faults", labels=["namespace", "pod", "workload", "kind"]
    )
    faults.add_metric(["team", "p-0", "train", "xid"], 1)
    hist = HistogramMetricFamily("lens_h_seconds", "H", labels=["op"])
    hist.add_metric(["read"], [("0.1", 1), ("+Inf", 3)], 2.0)
    return cache, [temp, faults, hist]


def number(t: int, v: float, start: int = 0, **labels: str) -> mp.NumberDataPoint:
    return mp.NumberDataPoint(
        start_time_unix_nano=start, time_unix_nano=t, as_double=v, attributes=kvs(labels.items())
    )


def counter(name: str, help_text: str, unit: str, *points: mp.NumberDataPoint) -> mp.Metric:
    return mp.Metric(
        name=name,
        description=help_text,
        unit=unit,
        sum=mp.Sum(data_points=points, aggregation_temporality=2, is_monotonic=True),
    )


def expected_metrics(start: int, t: int) -> ExportMetricsServiceRequest:
    """The request for families(), written with opentelemetry-proto's classes."""
    rtt = mp.HistogramDataPoint(
        start_time_unix_nano=start,
        time_unix_nano=t,
        count=3,
        sum=0.5,
        bucket_counts=[1, 0, 2],
        explicit_bounds=[0.001, 0.01],
        attributes=kvs([("raddr", "10.0.0.7")]),
    )
    h = mp.HistogramDataPoint(
        start_time_unix_nano=start,
        time_unix_nano=t,
        count=3,
        sum=2.0,
        bucket_counts=[1, 2],
        explicit_bounds=[0.1],
        attributes=kvs([("op", "read")]),
    )
    node = [
        counter(
            "lens_x_sent_bytes",
            "Sent",
            "By",
            number(t, 300.0, start, direction="egress", raddr="10.0.0.7"),
        ),
        counter("lens_container_process_execs", "Execs", "", number(t, 1.0, start)),
        mp.Metric(
            name="lens_x_rtt_seconds",
            description="RTT",
            unit="s",
            histogram=mp.Histogram(data_points=[rtt], aggregation_temporality=2),
        ),
        mp.Metric(
            name="hw_gpu_temperature_celsius",
            description="Temp",
            unit="Cel",
            gauge=mp.Gauge(data_points=[number(t, 41.5, gpu_index="0")]),
        ),
        mp.Metric(
            name="lens_h_seconds",
            description="H",
            unit="s",
            histogram=mp.Histogram(data_points=[h], aggregation_temporality=2),
        ),
    ]
    pod_c = [counter("lens_container_process_execs", "Execs", "", number(t, 2.0, start))]
    pod = [
        counter(
            "lens_gpu_faults", "Faults", "", number(t, 1.0, start, workload="train", kind="xid")
        )
    ]
    groups = ((resource(), node), (resource(*POD_C), pod_c), (resource(*POD), pod))
    return ExportMetricsServiceRequest(
        resource_metrics=[
            mp.ResourceMetrics(resource=r, scope_metrics=[mp.ScopeMetrics(scope=SCOPE, metrics=ms)])
            for r, ms in groups
        ]
    )


def test_a_snapshot_is_the_bytes_opentelemetry_proto_writes() -> None:
    cache, others = families()
    enc = MetricsEncoder(NODE, "9.9", started_ns=1000)
    snap = enc.encode([*from_cache(cache.snapshot()), *from_prometheus(others)], 5000)
    want = expected_metrics(1000, 5000)
    assert ExportMetricsServiceRequest.FromString(snap.body) == want
    assert snap.body == want.SerializeToString()
    assert snap.points == 7


def test_a_series_starts_when_first_seen_and_again_after_a_reset() -> None:
    cache = MetricCache()
    cache.register("c_total", COUNTER, "C", ("k",))
    cache.inc("c_total", ("a",), 5)
    enc = MetricsEncoder(NODE, started_ns=100)

    def starts(now: int) -> dict[str, tuple[int, float]]:
        req = ExportMetricsServiceRequest.FromString(
            enc.encode(from_cache(cache.snapshot()), now).body
        )
        pts = req.resource_metrics[0].scope_metrics[0].metrics[0].sum.data_points
        return {attrs(p.attributes)["k"]: (p.start_time_unix_nano, p.as_double) for p in pts}

    assert starts(1000) == {"a": (100, 5.0)}  # seen at once: from the exporter's start
    cache.inc("c_total", ("b",), 1)
    assert starts(2000) == {"a": (100, 5.0), "b": (1000, 1.0)}  # since the snapshot before
    cache.move("c_total", ("a",), "c_total", ("z",))  # a gone; a made again below, smaller
    cache.inc("c_total", ("a",), 2)
    got = starts(3000)
    assert got["a"] == (2000, 2.0) and got["b"] == (1000, 1.0)


def flow(**more: Any) -> FlowClosed:
    fields: dict[str, Any] = dict(
        kind="flow_closed",
        seq=7,
        ts_unix_nano=123456789,
        ts_ns=55,
        pid=10,
        comm="curl",
        cgroup_id=3,
        family="ipv4",
        laddr="10.0.0.1",
        lport=40000,
        raddr="10.0.0.2",
        rport=80,
        direction="egress",
        cls="k8sPod",
        sent_bytes=300,
        received_bytes=10,
        retransmits=0,
        duration_ns=1000,
        reason="close",
        remote_pod="web-0",
        remote_namespace="shop",
    )
    return FlowClosed(**{**fields, **more})


def expected_record(ev: Event, severity: int, text: str, moved: set[str]) -> lp.LogRecord:
    wire_name = {v: k for k, v in WIRE_ATTRS.items()}
    fields = [
        (wire_name.get(f.name, f.name), getattr(ev, f.name))
        for f in dataclasses.fields(ev)
        if f.init
        and f.name not in moved
        and f.name != "ts_unix_nano"
        and getattr(ev, f.name) not in ("", ())
    ]
    return lp.LogRecord(
        time_unix_nano=ev.ts_unix_nano,
        observed_time_unix_nano=ev.ts_unix_nano,
        severity_number=severity,
        severity_text=text,
        body=AnyValue(string_value=ev.kind),
        attributes=kvs(fields),
        event_name=ev.kind,
    )


OWNER = set(semconv.OWNER_FIELDS)


def test_events_are_log_records_under_their_pods() -> None:
    pod_flow = flow(namespace="shop", pod="client-0", workload_kind="Deployment", workload="client")
    host_flow = flow()
    proc = ProcessEvent(
        kind="process_exec",
        seq=8,
        ts_unix_nano=200,
        ts_ns=1,
        pid=5,
        ppid=1,
        comm="python",
        cgroup_id=9,
        cgroup="/k/p",
        filename="/usr/bin/python",
        container_id="abc123",
        container="trainer",
        pod="job-0",
        namespace="ml",
        pod_uid="u-1",
        workload_kind="PyTorchJob",
        workload="llm",
    )
    fault = GpuFault(
        seq=9,
        ts_unix_nano=300,
        gpu_index=0,
        bdf="0000:01:00.0",
        uuid="GPU-1",
        vendor="nvidia",
        fault="xid",
        code="79",
        message="fell off the bus",
        namespace="ml",
        pod="job-0",
        container="trainer",
        pid=-1,
    )
    gpu = DeviceChange(
        vendor="amd",
        bdf="0000:02:00.0",
        change="",
        device_kind="gpu",
        key="GPU-2",
        index=1,
        retired_pages_pending=True,
    )
    inv = DeviceInventory(seq=10, ts_unix_nano=400, devices=(gpu,))
    got = LogsEncoder(NODE, "9.9").encode([pod_flow, host_flow, proc, fault, inv])
    shop = (
        ("k8s.namespace.name", "shop"),
        ("k8s.pod.name", "client-0"),
        ("k8s.deployment.name", "client"),
    )
    ml = (
        ("k8s.namespace.name", "ml"),
        ("k8s.pod.name", "job-0"),
        ("k8s.pod.uid", "u-1"),
        ("k8s.container.name", "trainer"),
        ("container.id", "abc123"),
        ("workload_kind", "PyTorchJob"),
        ("workload", "llm"),
    )
    ml_fault = (
        ("k8s.namespace.name", "ml"),
        ("k8s.pod.name", "job-0"),
        ("k8s.container.name", "trainer"),
    )
    groups = [
        (resource(*shop), [expected_record(pod_flow, 9, "INFO", OWNER)]),
        (
            resource(),
            [expected_record(host_flow, 9, "INFO", OWNER), expected_record(inv, 9, "INFO", OWNER)],
        ),
        (resource(*ml), [expected_record(proc, 9, "INFO", OWNER)]),
        (resource(*ml_fault), [expected_record(fault, 17, "ERROR", OWNER)]),
    ]
    want = ExportLogsServiceRequest(
        resource_logs=[
            lp.ResourceLogs(resource=r, scope_logs=[lp.ScopeLogs(scope=SCOPE, log_records=recs)])
            for r, recs in groups
        ]
    )
    assert ExportLogsServiceRequest.FromString(got.body) == want
    assert got.body == want.SerializeToString()
    assert got.points == 5
    rec = want.resource_logs[0].scope_logs[0].log_records[0]
    assert attrs(rec.attributes)["class"] == "k8sPod" and "namespace" not in attrs(rec.attributes)


def test_wire_values_are_the_librarys() -> None:
    for v in ("", "é", True, False, 0, -1, 1 << 62, 2.5, 0.0, [1, "a"], {"k": [True]}):
        assert wire.any_value(v) == any_value(v).SerializeToString(), v
    assert wire.any_value(1 << 64) == AnyValue(string_value=str(1 << 64)).SerializeToString()
    assert wire.find_string(b"\x08\x03\x12\x03bad", 2) == "bad"


def test_settings_are_off_by_default_and_need_an_endpoint() -> None:
    s = config.load(None, env={}).collectors.section("otlp")
    assert s.enabled is False and s.metrics.interval_seconds == 30 and s.logs.queue == 100000  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="collectors.otlp.endpoint: Value error, '': an http"):
        config.load(None, env={"LENS_COLLECTORS__OTLP__ENABLED": "true"})
    with pytest.raises(ConfigError, match="unknown event kind"):
        config.load(None, env={"LENS_COLLECTORS__OTLP__LOGS__KINDS": "[flows]"})


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    rx = OtlpReceiver().start()
    yield rx
    rx.stop()


def metrics_body(value: float) -> bytes:
    """A request with one gauge point, its value telling requests apart."""
    return ExportMetricsServiceRequest(
        resource_metrics=[
            mp.ResourceMetrics(
                scope_metrics=[
                    mp.ScopeMetrics(
                        metrics=[
                            mp.Metric(name="g", gauge=mp.Gauge(data_points=[number(1, value)]))
                        ]
                    )
                ]
            )
        ]
    ).SerializeToString()


def values(rx: OtlpReceiver) -> list[float]:
    return [
        r.message.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].as_double
        for r in rx.metrics()
    ]


def sender(
    rx: OtlpReceiver, stats: exporter.SignalStats, take: Any, stop: threading.Event
) -> exporter.Sender:
    client = exporter.HttpClient(rx.endpoint, {"x-tenant": "a"}, 2.0, gzip_body=False)
    snd = exporter.Sender(exporter.METRICS, client, take, stats, 0.05, stop)
    snd.thread.start()
    return snd


def test_an_outage_keeps_the_batch_in_hand_and_the_newest_of_the_queue(
    receiver: OtlpReceiver,
) -> None:
    receiver.stop()  # its port stays ours to open again
    stats, stop = exporter.SignalStats(), threading.Event()
    queue = exporter.SnapshotQueue(3, stats)
    snd = sender(receiver, stats, queue.take, stop)
    try:
        queue.put(exporter.Batch(metrics_body(0), 10))
        wait_for(
            lambda: snd.held is not None and stats.requests["retry"] >= 2,
            "the first batch in hand, sent again",
        )
        for i in range(1, 10):
            queue.put(exporter.Batch(metrics_body(i), 10))
        assert len(queue) == 3 and queue.dropped == 60 and stats.batches["dropped"] == 6
        receiver.start()
        wait_for(lambda: len(receiver.metrics()) == 4, "the four held", 10)
        assert values(receiver) == [0.0, 7.0, 8.0, 9.0]  # in order
        assert stats.exported == 40 and stats.batches["exported"] == 4
        assert receiver.metrics()[0].headers["x-tenant"] == "a"
        col = {
            m.name: m
            for m in exporter.OtlpCollector({"metrics": stats}, {"metrics": queue}).collect()
        }
        dropped = {
            tuple(s.labels.values()): s.value for s in col["lens_agent_otlp_dropped"].samples
        }
        assert dropped[("metrics", "queue_full")] == 60
    finally:
        stop.set()
        snd.thread.join(5)


def test_refusals_partial_success_and_retry_after(receiver: OtlpReceiver) -> None:
    stats, stop = exporter.SignalStats(), threading.Event()
    queue = exporter.SnapshotQueue(10, stats)
    snd = sender(receiver, stats, queue.take, stop)
    try:
        receiver.status = 400
        queue.put(exporter.Batch(metrics_body(1), 5))
        wait_for(lambda: stats.batches["rejected"] == 1, "the refusal")
        assert stats.dropped["rejected"] == 5 and stats.requests["retry"] == 0
        receiver.status, receiver.retry_after = 503, "1"
        queue.put(exporter.Batch(metrics_body(2), 5))
        wait_for(lambda: stats.requests["retry"] >= 1, "a 503")
        t0 = time.monotonic()
        receiver.status = 200
        receiver.partial["/v1/metrics"] = 2
        wait_for(lambda: stats.batches["exported"] == 1, "the batch, once the endpoint takes it")
        assert time.monotonic() - t0 > 0.3  # Retry-After: 1 s, not the 0.05 s backoff
        assert stats.requests["retry"] == 1  # told to wait, it waited
        assert stats.exported == 3 and stats.dropped["rejected"] == 7
    finally:
        stop.set()
        snd.thread.join(5)


def test_events_leave_in_batches_and_the_subscription_is_the_queue() -> None:
    bus = EventBus(100)
    sub = bus.subscribe("otlp", maxsize=4)
    stats = exporter.SignalStats()
    batches = exporter.EventBatches(sub, 4, LogsEncoder(NODE), 3, 0.05, True, stats)
    for i in range(6):
        bus.publish(flow(lport=i))
    assert batches.dropped == 2 and len(batches) == 4  # the two oldest went
    first = batches.take(0.1)
    second = batches.take(0.1)  # one left: it waits linger_seconds for more, then goes
    assert first is not None and second is not None and (first.items, second.items) == (3, 1)
    assert batches.take(0.05) is None
    assert stats.made == 2


@pytest.mark.usefixtures("tracefs_readable")
def test_the_agent_exports_its_metrics_and_a_gpu_fault(receiver: OtlpReceiver) -> None:
    from lens_ebpf.agent.service import Agent

    off = {
        ("collectors", k, "enabled"): False
        for k in ("tcp", "rtt", "processes", "gpu", "rdma", "system", "drops")
    }
    agent = Agent(
        config.load(
            None,
            env={},
            overrides={
                **off,
                ("server", "host"): "127.0.0.1",
                ("server", "port"): 0,
                ("grpc", "listen"): "127.0.0.1:0",
                ("kubernetes", "mode"): "off",
                ("kubernetes", "pod_resources", "enabled"): False,
                ("node", "name"): "node-a",
                ("collectors", "otlp", "enabled"): True,
                ("collectors", "otlp", "endpoint"): receiver.endpoint + "/base/",
                ("collectors", "otlp", "metrics", "interval_seconds"): 0.2,
                ("collectors", "otlp", "logs", "linger_seconds"): 0.0,
            },
        )
    )
    agent.start()
    try:
        agent.ctx.bus.publish(
            GpuFault(
                gpu_index=3,
                bdf="0000:03:00.0",
                uuid="GPU-3",
                vendor="amd",
                fault="ras",
                code="umc",
                message="ECC",
                namespace="ml",
                pod="job-0",
            )
        )
        wait_for(lambda: receiver.of("/base/v1/logs"), "the fault's record")
        rl = receiver.of("/base/v1/logs")[0].message.resource_logs[0]
        res = attrs(rl.resource.attributes)
        assert res["k8s.pod.name"] == "job-0" and res["host.name"] == "node-a"
        rec = rl.scope_logs[0].log_records[0]
        assert rec.severity_text == "ERROR" and rec.event_name == "gpu_fault"
        assert attrs(rec.attributes)["gpu_index"] == 3

        def feature_up() -> float | None:
            for r in receiver.of("/base/v1/metrics"):
                for rm in r.message.resource_metrics:
                    for m in rm.scope_metrics[0].metrics:
                        if m.name == "lens_agent_feature_up":
                            for p in m.gauge.data_points:
                                if attrs(p.attributes)["feature"] == "otlp":
                                    return p.as_double
            return None

        assert wait_for(feature_up, "lens_agent_feature_up{feature=otlp}") == 1.0
        assert json.loads(json.dumps(agent.views()["otlp"])) == {"state": "running", "reason": ""}
    finally:
        agent.stop()
