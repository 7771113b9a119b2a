"""Why did my job slow down at minute 29? The issue's scenario, end to end: a 4-pod
PyTorchJob on the API stand-in whose iterations go from 1.0 s to 2.0 s at a known
moment (its logs through POST /logs), while one pod's GPU logs an Xid (its agent's
report), the driver asks for a reset, and that pod's node's TCP RTT to the others rises,
its GPU throttles and its RDMA port errs (a real Prometheus holding those series): the
timeline shows them in order, and the outlier job names that pod."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from lens_ebpf.protocol.gen import lens_pb2 as pb
from tests.k8slab import FakeApiServer, eventually
from tests.recorder.conftest import rows
from tests.recorder.objects import NS, U
from tests.recorder.test_node_events import report
from tests.recorder.test_training import WORKERS, fluent_bit, get, megatron, metric, post, started

SLOW = 3  # bert-worker-3, on gpu-4
XID = (
    "NVRM: Xid (PCI:0000:c1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
    "the bus."
)
BDF = "0000:c1:00.0"


def series(t0: int) -> str:
    """Minute samples from t0 to t0 + 50 min: every node's RTT histogram to the job's
    pods (p50 0.75 ms; gpu-4's 7.5 ms from minute 31), the pods' GPU utilization (90),
    a thermal slowdown on worker 3's GPU from minute 33, and errors on gpu-4's RDMA port
    from minute 35 (30 a minute)."""
    out = ["# TYPE lens_tcp_rtt_seconds histogram\n"]
    for n in range(4):
        node = f"gpu-{n + 1}"
        for peer in (p for i, p in enumerate(WORKERS) if i != n):
            lbl = (
                f'node="{node}",direction="egress",type="k8sPod",raddr="10.1.0.{n}",'
                f'remote_namespace="{NS}",remote_pod="{peer}",remote_workload_kind='
                f'"PyTorchJob",remote_workload="bert",remote_service=""'
            )
            fast = slow = 0
            for m in range(51):
                if m:
                    if n == SLOW and m >= 31:
                        slow += 60
                    else:
                        fast += 60
                ts = t0 + 60 * m
                for le, count in (
                    ("0.0005", 0),
                    ("0.001", fast),
                    ("0.005", fast),
                    ("0.01", fast + slow),
                    ("+Inf", fast + slow),
                ):
                    out.append(f'lens_tcp_rtt_seconds_bucket{{{lbl},le="{le}"}} {count} {ts}\n')
                out.append(f"lens_tcp_rtt_seconds_count{{{lbl}}} {fast + slow} {ts}\n")
                out.append(f"lens_tcp_rtt_seconds_sum{{{lbl}}} {0.00075 * fast} {ts}\n")
    out.append("# TYPE gpu_utilization gauge\n")
    for n, pod in enumerate(WORKERS):
        lbl = f'node="gpu-{n + 1}",gpu_id="0",vendor="nvidia",namespace="{NS}",pod="{pod}"'
        out += [f"gpu_utilization{{{lbl}}} 90 {t0 + 60 * m}\n" for m in range(51)]
    out.append("# TYPE lens_gpu_clock_event_active gauge\n")
    for reason, start in (("hw_thermal_slowdown", 33), ("gpu_idle", 0)):  # idle: not one
        lbl = (
            f'node="gpu-4",gpu_index="0",vendor="nvidia",namespace="{NS}",'
            f'pod="{WORKERS[SLOW]}",reason="{reason}"'
        )
        out += [
            f"lens_gpu_clock_event_active{{{lbl}}} {int(m >= start)} {t0 + 60 * m}\n"
            for m in range(51)
        ]
    out.append("# TYPE lens_rdma_port_receive_errors counter\n")
    port = 'node="gpu-4",device="mlx5_0",port="1"'
    out += [
        f"lens_rdma_port_receive_errors_total{{{port}}} {30 * max(0, m - 34)} {t0 + 60 * m}\n"
        for m in range(51)
    ]
    return "".join(out) + "# EOF\n"


def gpu(change: str, **fields: Any) -> pb.DeviceChange:
    return pb.DeviceChange(
        device_kind="gpu",
        vendor="nvidia",
        bdf=BDF,
        slot=BDF,
        index=0,
        key="GPU-4f1e",
        uuid="GPU-4f1e",
        model="NVIDIA H100 80GB HBM3",
        serial="1652923005678",
        holder=f"{NS}/{WORKERS[SLOW]}",
        change=change,
        **fields,
    )


def test_the_timeline_and_the_outlier_of_a_job_that_slowed_down(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    from tests.promserver import Prometheus, available

    if available():
        pytest.skip(available())
    t0 = (int(datetime.now(UTC).timestamp()) // 3600 - 3) * 3600
    prometheus = Prometheus([], openmetrics=series(t0))
    now = datetime.fromtimestamp(t0 + 2400, UTC)  # minute 40
    try:
        app = started(
            api,
            recorder_app,
            db_url,
            clock=lambda: now,
            prometheus__url=prometheus.base,
            training__check_seconds=3600,
            jobs__outliers_seconds=3600,
        )
        # every rank prints every iteration: 60 of 1.0 s from minute 28, then 2.0 s (the
        # first slow one, iteration 61, ends at 29:02) up to minute 40
        times, secs = [], [1.0] * 60 + [2.0] * 330
        at = float(t0 + 28 * 60)
        for s in secs:
            at += s
            times.append(at)
        for rank, pod in enumerate(WORKERS):
            texts = [megatron(i + 1, s * 1000) for i, s in enumerate(secs)]
            r = post(app, fluent_bit(pod, texts, [ts + rank / 10 for ts in times]))
            assert r.status_code == 200 and r.json()["data"]["parsed"] == len(secs), r.text
        # gpu-4's agent: its GPU held by worker 3 (30:00), an Xid 79 (30:30), the driver
        # asks for a reset (30:45); worker 3's queue pairs on mlx5_0
        who = pb.Identity(
            namespace=NS,
            pod=WORKERS[SLOW],
            pod_uid=f"uid-{WORKERS[SLOW]}",
            container="pytorch",
            workload_kind="PyTorchJob",
            workload="bert",
        )
        ns = 1_000_000_000
        events = [
            pb.Event(
                seq=1,
                ts_unix_nano=(t0 + 1800) * ns,
                node_name="gpu-4",
                device_inventory=pb.DeviceInventory(devices=[gpu("appeared")]),
            ),
            pb.Event(
                seq=2,
                ts_unix_nano=(t0 + 1830) * ns,
                node_name="gpu-4",
                gpu_fault=pb.GpuFault(
                    gpu_index=0,
                    bdf=BDF,
                    uuid="GPU-4f1e",
                    vendor="nvidia",
                    fault="xid",
                    code="79",
                    message=XID,
                    identity=who,
                ),
            ),
            pb.Event(
                seq=3,
                ts_unix_nano=(t0 + 1845) * ns,
                node_name="gpu-4",
                device_change=gpu(
                    "changed", recovery_action="gpu_reset", fields=["recovery_action"]
                ),
            ),
            pb.Event(
                seq=4,
                ts_unix_nano=(t0 + 1700) * ns,
                node_name="gpu-4",
                rdma_open=pb.RdmaUse(device="mlx5_0", queue_pairs=4, identity=who),
            ),
        ]
        assert report(app.collect_port, "gpu-4", events)[-1] == 4
        assert app.writer.flush(10)

        # the rank that holds the others back, as the job at minute 40 sees it
        assert app.outliers.run_once(now) == 1
        assert app.outliers.run_once(now) == 0  # still the one, not found again
        lbl = (
            f'namespace="{NS}",workload="bert",pod="{WORKERS[SLOW]}",node="gpu-4",'
            f'signal="tcp_rtt"'
        )
        assert metric(app, f"lens_workload_outlier{{{lbl}}}") == 1
        assert app.writer.flush(10)
        (outlier,) = (e for e in rows(db_url, "training_events") if e["kind"] == "outlier")
        assert (outlier["pod"], outlier["node"], outlier["signal"]) == (
            WORKERS[SLOW],
            "gpu-4",
            "tcp_rtt",
        )
        assert outlier["value"] == pytest.approx(0.0075) and outlier["baseline"] == pytest.approx(
            0.00075
        )
        assert outlier["detail"] == {"score": None, "direction": "high", "window_seconds": 300}

        data = get(app, f"/v1/workloads/{U['bert']}/timeline?start={t0 + 30}&end={t0 + 2400}")
        assert data["incomplete"] == [] and data["pods"] == WORKERS
        assert (data["kind"], data["name"], data["start"], data["end"]) == (
            "PyTorchJob",
            "bert",
            t0 + 30,
            t0 + 2400,
        )
        got = [
            (e["time"] - t0, e["type"], e["pod"], e["node"], e["device"])
            for e in data["entries"]
            if not e["type"].startswith("pod_")
        ]
        assert got == [
            (29 * 60 + 2.0, "training_slowdown", WORKERS[0], "gpu-1", ""),
            (30 * 60, "device_change", WORKERS[SLOW], "gpu-4", BDF),  # it appeared
            (30 * 60 + 30, "gpu_fault", WORKERS[SLOW], "gpu-4", BDF),
            (30 * 60 + 45, "device_change", WORKERS[SLOW], "gpu-4", BDF),
            (31 * 60 + 30, "tcp_rtt_regression", WORKERS[SLOW], "gpu-4", ""),
            (33 * 60 + 30, "gpu_throttling", WORKERS[SLOW], "gpu-4", "gpu0"),
            (35 * 60 + 30, "rdma_error_regression", WORKERS[SLOW], "gpu-4", "mlx5_0/1"),
            (40 * 60, "outlier", WORKERS[SLOW], "gpu-4", ""),
        ]
        by_type = {e["type"]: e for e in data["entries"]}
        assert by_type["training_slowdown"]["detail"] == {
            "iteration": 61,
            "iteration_seconds": 2.0,
            "median_seconds": 1.0,
            "ratio": 2.0,
            "factor": 1.5,
            "window": 50,
            "ended_at": None,
        }
        assert by_type["gpu_fault"]["detail"]["code"] == "79"
        assert "fallen off the bus" in by_type["gpu_fault"]["message"]
        assert by_type["device_change"]["detail"] == {
            "kind": "gpu",
            "device_key": "GPU-4f1e",
            "field": "recovery_action",
            "old": "",
            "new": "gpu_reset",
        }
        rtt = by_type["tcp_rtt_regression"]["detail"]
        assert (rtt["value"], rtt["baseline"]) == (pytest.approx(0.0075), pytest.approx(0.00075))
        assert rtt["ratio"] == pytest.approx(10.0) and rtt["until"] == t0 + 2400 - 30
        assert by_type["gpu_throttling"]["detail"] == {"reason": "hw_thermal_slowdown"}
        assert by_type["rdma_error_regression"]["detail"]["baseline"] == 0.0
        assert by_type["outlier"]["detail"]["signal"] == "tcp_rtt"
        # the pods' own events are there too (the API stand-in's Running pods)
        assert {e["type"] for e in data["entries"]} >= {"pod_created"}
        # a child of the job's hierarchy has no child here; an unknown uid is a 404
        r = __import__("requests").get(
            f"http://127.0.0.1:{app.http.port}/v1/workloads/nope/" "timeline", timeout=10
        )
        assert r.status_code == 404 and r.json()["meta"]["code"] == 4004
        bad = (
            __import__("requests")
            .get(
                f"http://127.0.0.1:{app.http.port}/v1/workloads/"
                f"{U['bert']}/timeline?start={t0}&end={t0 - 60}",
                timeout=10,
            )
            .json()
        )
        assert bad["meta"]["code"] == 4001 and "before" in bad["meta"]["message"]
        eventually(lambda: True, timeout=1)
    finally:
        prometheus.stop()
    # Prometheus gone: the tables' entries, and what is missing, said (meta.message too)
    body = (
        __import__("requests")
        .get(
            f"http://127.0.0.1:{app.http.port}/v1/workloads/{U['bert']}/timeline?start={t0 + 30}"
            f"&end={t0 + 2400}",
            timeout=10,
        )
        .json()
    )
    data = body["data"]
    assert "unavailable" in data["incomplete"][0]
    assert body["meta"] == {
        "code": 2000,
        "message": "OK; figures unknown, answered as 0: "
        f"timeline entries from Prometheus: {data['incomplete'][0]}",
    }
    assert "gpu_fault" in {e["type"] for e in data["entries"]}
    assert "tcp_rtt_regression" not in {e["type"] for e in data["entries"]}
