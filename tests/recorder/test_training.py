"""Training progress through POST /logs, as log shippers send it, into the recorder
(the API stand-in's PyTorchJob with four GPU pods; SQLite and PostgreSQL): every format's
real lines in every shipper's body, the points and the summary exactly, slowdowns and
stalls, a restart, and every bad body's answer."""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import hang_guard
from tests.k8slab import FakeApiServer, eventually
from tests.recorder.conftest import example, rows
from tests.recorder.objects import NS, U, gpu_pod, state, template, workload
from tests.recorder.test_faults import metric
from tests.unit.test_training import MEGATRON_SECONDS

FIX = Path(__file__).parent.parent / "fixtures" / "training"
NV = "nvidia.com/gpu"
WORKERS = [f"bert-worker-{i}" for i in range(4)]


def bert(api: FakeApiServer) -> None:
    """A PyTorchJob with four one-GPU workers, bert-worker-i on gpu-(i+1), running."""
    spec = {"pytorchReplicaSpecs": {"Worker": {"replicas": 4, "template": template(NV, 1)}}}
    api.put("pytorchjobs", workload("bert", spec, {}))
    for i, name in enumerate(WORKERS):
        api.put("pods", state(gpu_pod(name, "bert", NV, 1, f"gpu-{i + 1}"), "Running", True))


def started(api: FakeApiServer, recorder_app: Any, url: str, **settings: Any) -> Any:
    bert(api)
    app = recorder_app(url, **settings)
    eventually(
        lambda: sum(r["running"] for r in rows(url, "gpu_pods")) == 4
        and app.tracker.gpu_pod(NS, WORKERS[3]) is not None,
        timeout=15,
    )
    return app


def post(
    app: Any, body: bytes | str | list[Any], path: str = "/logs", **kw: Any
) -> requests.Response:
    data = json.dumps(body).encode() if isinstance(body, list) else body
    kw["headers"] = {"Content-Type": "application/json", **kw.get("headers", {})}
    return requests.post(
        f"http://127.0.0.1:{app.http.port}{path}", data=data, timeout=hang_guard(10), **kw
    )


def fluent_bit(pod: str, texts: list[str], times: list[float]) -> list[dict[str, Any]]:
    """Fluent Bit's http output (format json): date in unix seconds, the kubernetes
    filter's fields."""
    return [
        {
            "date": ts,
            "log": text + "\n",
            "stream": "stdout",
            "time": "",
            "kubernetes": {
                "pod_name": pod,
                "namespace_name": NS,
                "pod_id": f"uid-{pod}",
                "container_name": "pytorch",
                "host": "gpu-1",
            },
        }
        for text, ts in zip(texts, times, strict=True)
    ]


def vector(pod: str, texts: list[str], times: list[float]) -> list[dict[str, Any]]:
    """Vector's http sink (codec json) of kubernetes_logs events."""
    return [
        {
            "message": text,
            "source_type": "kubernetes_logs",
            "timestamp": datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z"),
            "kubernetes": {
                "pod_name": pod,
                "pod_namespace": NS,
                "pod_uid": f"uid-{pod}",
                "container_name": "pytorch",
            },
        }
        for text, ts in zip(texts, times, strict=True)
    ]


def lines(name: str) -> list[str]:
    return [x for x in (FIX / name).read_text().splitlines() if x.strip()]


def get(app: Any, path: str) -> Any:
    r = requests.get(f"http://127.0.0.1:{app.http.port}{path}", timeout=hang_guard(5))
    body = r.json()
    example(path, body)
    assert r.status_code == 200 and body["meta"]["code"] == 2000, body
    return body["data"]


def points(url: str, pod: str) -> list[tuple[Any, ...]]:
    return [
        (
            r["format"],
            r["iteration"],
            r["iteration_seconds"],
            r["tokens_per_second"],
            r["tflops_per_gpu"],
            r["loss"],
            r["skipped_iterations"],
            r["samples_per_second"],
        )
        for r in rows(url, "training_points")
        if r["pod"] == pod
    ]


def test_each_shippers_body_of_each_formats_real_lines(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    t0 = float(int(datetime.now(UTC).timestamp()) // 60 * 60 - 7200)
    now = datetime.fromtimestamp(t0 + 3000, UTC)
    app = started(api, recorder_app, db_url, clock=lambda: now)
    # Megatron's run through Fluent Bit (format json), one line every 13 s, for worker 0
    mega = lines("megatron-single-node.log")
    times = [t0 + 13 * i for i in range(len(mega))]
    r = post(app, fluent_bit(WORKERS[0], mega, times), headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "meta": {"code": 2000, "message": "OK"},
        "data": {
            "shipper": "fluent-bit",
            "lines": 20,
            "malformed": 0,
            "parsed": 10,
            "not_progress": 10,
            "not_gpu_pod": 0,
            "no_workload": 0,
            "duplicate": 0,
        },
    }
    # torchtitan through Vector for worker 1: steps 1, 10, 530, two seconds a step
    titan = lines("torchtitan.log")
    r = post(app, vector(WORKERS[1], titan, [t0 + 1000, t0 + 1018, t0 + 2058]))
    assert r.json()["data"]["shipper"] == "vector" and r.json()["data"]["parsed"] == 3
    # DeepSpeed as plain lines (its time: when it arrived), gzip'd, for worker 2
    r = post(
        app,
        gzip.compress("\n".join(lines("deepspeed.log")).encode()),
        params={"namespace": NS, "pod": WORKERS[2], "container": "main"},
        headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"},
    )
    assert r.status_code == 200, r.text
    assert r.json()["data"] == {
        "shipper": "plain",
        "lines": 4,
        "malformed": 0,
        "parsed": 4,
        "not_progress": 0,
        "not_gpu_pod": 0,
        "no_workload": 0,
        "duplicate": 0,
    }
    # Hugging Face's Trainer through Fluent Bit's json_lines, under /v1/logs, for worker 3;
    # and a pod the service does not follow (not a GPU pod)
    hf = lines("hf_trainer.log")
    recs = fluent_bit(WORKERS[3], hf, [t0 + 2500 + i for i in range(len(hf))])
    recs += fluent_bit("web-0", ["{'loss': 1.0, 'epoch': 1.0}"], [t0 + 2600])
    r = post(app, "\n".join(json.dumps(x) for x in recs), path="/v1/logs")
    assert r.json()["data"] == {
        "shipper": "fluent-bit",
        "lines": 7,
        "malformed": 0,
        "parsed": 5,
        "not_progress": 1,
        "not_gpu_pod": 1,
        "no_workload": 0,
        "duplicate": 0,
    }
    assert app.writer.flush(10)

    assert points(db_url, WORKERS[0])[0] == ("megatron", 1, 19.1388, None, 80.2, 10.43863, 0, None)
    assert [p[2] for p in points(db_url, WORKERS[0])] == MEGATRON_SECONDS
    # torchtitan prints no time per step: the gap between lines over the steps between
    assert points(db_url, WORKERS[1]) == [
        ("torchtitan", 1, None, 375.0, 21.73, 12.2254, None, None),
        ("torchtitan", 10, 2.0, 7034.0, 407.35, 10.7069, None, None),
        ("torchtitan", 530, 2.0, 829.0, 23.15, 5.9866, None, None),
    ]
    assert points(db_url, WORKERS[2]) == [
        ("deepspeed", 30, None, None, None, None, 20, None),
        ("deepspeed", 30, 0.283, None, None, 10.7133, None, 226.457),
        ("deepspeed", 100, 0.186, None, None, 0.0585, None, 53.694),
        ("deepspeed", 200, 0.936, None, None, 5.5508, None, 136.706),
    ]
    assert {
        r["at"].timestamp() if r["at"].tzinfo else r["at"].replace(tzinfo=UTC).timestamp()
        for r in rows(db_url, "training_points")
        if r["pod"] == WORKERS[2]
    } == {now.timestamp()}
    assert points(db_url, WORKERS[3]) == [
        ("hf_trainer", None, None, None, None, v, None, None) for v in (0.1841, 0.1784, 0.1846)
    ] + [
        ("hf_trainer", None, 1 / 1.226, None, None, 0.3935928952693939, None, 4.903),
        ("hf_trainer", None, None, None, None, 2.205, None, None),
    ]

    # the Megatron minutes: ten iterations, exactly
    perf = get(
        app,
        f"/v1/workloads/{U['bert']}/trainingPerformance?start={int(t0)}" f"&end={int(t0) + 300}",
    )
    assert perf["summary"] == {
        "iterations": 10,
        "mean_iteration_seconds": 13.65049,
        "p50_iteration_seconds": 13.06995,
        "p95_iteration_seconds": 16.41315,
        "tokens_per_second": None,
        "tflops_per_gpu": 114.02,
        "last_loss": 9.947481,
    }
    assert perf["points"][0] == {
        "time": t0 + 13 * mega.index(next(x for x in mega if "iteration        1/" in x)),
        "pod": WORKERS[0],
        "node": "gpu-1",
        "format": "megatron",
        "iteration": 1,
        "target_iterations": 5000,
        "iteration_seconds": 19.1388,
        "tokens_per_second": None,
        "tflops_per_gpu": 80.2,
        "loss": 10.43863,
        "skipped_iterations": 0,
        "nan_iterations": 0,
        "samples_per_second": None,
    }
    # the same range in milliseconds, as the original and Grafana send it
    ms = get(
        app,
        f"/api/workloads/{U['bert']}/trainingPerformance?start={int(t0) * 1000}"
        f"&end={(int(t0) + 300) * 1000}",
    )
    assert ms == perf
    whole = get(app, f"/v1/workloads/{U['bert']}/trainingPerformance")
    assert len(whole["points"]) == 22
    # iterations with a time, each once: Megatron's 10, torchtitan's 2, DeepSpeed's 3
    lbl = f'namespace="{NS}",workload="bert"'
    assert metric(app, f"lens_training_iteration_seconds_count{{{lbl}}}") == 15
    assert metric(app, f"lens_training_iteration_seconds_sum{{{lbl}}}") == pytest.approx(
        136.5049 + 4.0 + 0.283 + 0.186 + 0.936
    )
    assert metric(app, f"lens_training_loss{{{lbl}}}") == 2.205  # the last line's
    assert metric(app, f"lens_training_tflops_per_gpu{{{lbl}}}") == 23.15
    assert metric(app, 'lens_recorder_log_lines_total{result="parsed"}') == 22
    assert metric(app, 'lens_recorder_log_lines_total{result="not_gpu_pod"}') == 1
    assert metric(app, 'lens_recorder_post_requests_total{route="/logs",code="200"}') == 4
    assert rows(db_url, "training_events") == []  # nothing slowed down

    # a shipper's retry: every line again, nothing twice
    r = post(app, fluent_bit(WORKERS[0], mega, times))
    assert r.json()["data"] | {"shipper": ""} == {
        "shipper": "",
        "lines": 20,
        "malformed": 0,
        "parsed": 0,
        "not_progress": 10,
        "not_gpu_pod": 0,
        "no_workload": 0,
        "duplicate": 10,
    }
    assert app.writer.flush(10)
    assert len(rows(db_url, "training_points")) == 22
    r = requests.get(
        f"http://127.0.0.1:{app.http.port}/v1/workloads/nope/trainingPerformance",
        timeout=hang_guard(5),
    )
    assert r.status_code == 404 and r.json()["meta"]["code"] == 4004


def megatron(i: int, ms: float) -> str:
    """A Megatron-LM iteration line, as its training_log prints it."""
    return (
        f" [2026-11-25 14:02:{i % 60:02d}] iteration {i:8d}/{1000:8d} | consumed samples: "
        f"{128 * i:12d} | elapsed time per iteration (ms): {ms:.1f} | throughput per GPU "
        f"(TFLOP/s/GPU): 117.5 | learning rate: 6.976744E-07 | global batch size:   128 | "
        f"lm loss: 9.947481E+00 | loss scale: 1.0 | grad norm: 23.632 | number of skipped "
        f"iterations:   0 | number of nan iterations:   0 |"
    )


def run(app: Any, first: int, seconds: list[float], start: float) -> float:
    """Iterations first.. taking these seconds, each printed by all four ranks (rank r a
    tenth of a second after rank 0); the time of the last."""
    at = start
    for i, s in enumerate(seconds):
        at += s
        for rank, pod in enumerate(WORKERS):
            r = post(app, fluent_bit(pod, [megatron(first + i, s * 1000)], [at + rank / 10]))
            assert r.status_code == 200, r.text
    return at


def test_a_slowdown_and_a_stall_and_a_restart(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    t0 = float(int(datetime.now(UTC).timestamp()) // 60 * 60 - 7200)
    clock = [datetime.fromtimestamp(t0, UTC)]
    app = started(
        api, recorder_app, db_url, clock=lambda: clock[0], training__check_seconds=3600
    )  # stalls looked for when the test says
    last = run(app, 1, [1.0] * 60, t0)  # iterations 1..60 at 1.0 s
    slow_at = t0 + 61 * 1.0 + 1.0  # iteration 61, the first of 2.0 s
    last = run(app, 61, [2.0] * 20, last)  # 61..80
    back_at = last + 1.0  # iteration 81: 1.0 s again
    last = run(app, 81, [1.0] * 10, last)  # 81..90
    assert app.writer.flush(10)
    (slow,) = rows(db_url, "training_events")
    assert (
        slow["kind"],
        slow["pod"],
        slow["node"],
        slow["iteration"],
        slow["value"],
        slow["baseline"],
        slow["workload"],
    ) == ("training_slowdown", WORKERS[0], "gpu-1", 61, 2.0, 1.0, "bert")
    assert slow["at"].replace(tzinfo=UTC).timestamp() == slow_at
    assert slow["ended_at"].replace(tzinfo=UTC).timestamp() == back_at
    assert slow["detail"] == {"ratio": 2.0, "factor": 1.5, "window": 50}
    lbl = f'namespace="{NS}",workload="bert"'
    assert metric(app, f"lens_training_iteration_seconds_count{{{lbl}}}") == 90  # not 360
    assert metric(app, f'lens_training_iteration_seconds_bucket{{{lbl},le="1.0"}}') == 70
    assert metric(app, f"lens_training_slowdowns_total{{{lbl}}}") == 1
    assert metric(app, f"lens_training_slowdown_active{{{lbl}}}") == 0

    # no progress: a stall once five medians (1.0 s) pass, while its pods run
    clock[0] = datetime.fromtimestamp(last + 4.9, UTC)
    assert app.training.check(clock[0]) == 0
    clock[0] = datetime.fromtimestamp(last + 6, UTC)
    assert app.training.check(clock[0]) == 1
    assert app.training.check(clock[0]) == 0  # one stall, not one per look
    assert metric(app, f"lens_training_stalled{{{lbl}}}") == 1
    run(app, 91, [7.0], last)  # progress again: the stall ends (and 7 s is slow: a slowdown)
    assert app.writer.flush(10)
    slow1, stall, slow2 = rows(db_url, "training_events")
    assert (stall["kind"], stall["pod"], stall["iteration"], stall["value"], stall["baseline"]) == (
        "training_stalled",
        "",
        90,
        6.0,
        1.0,
    )
    assert stall["at"].replace(tzinfo=UTC).timestamp() == last
    assert stall["ended_at"].replace(tzinfo=UTC).timestamp() == last + 7.0
    assert (slow2["kind"], slow2["iteration"], slow2["value"], slow2["ended_at"]) == (
        "training_slowdown",
        91,
        7.0,
        None,
    )
    assert metric(app, f"lens_training_stalls_total{{{lbl}}}") == 1
    assert metric(app, f"lens_training_stalled{{{lbl}}}") == 0

    # the service restarts: the median, the open slowdown and the lines it holds survive
    app.stop()
    again = recorder_app(db_url, clock=lambda: clock[0], training__check_seconds=3600)
    uid = U["bert"]
    assert list(again.training.runs[uid].window) == list(app.training.runs[uid].window)
    r = post(again, fluent_bit(WORKERS[0], [megatron(91, 7000.0)], [last + 7.0]))
    assert r.json()["data"]["duplicate"] == 1
    eventually(lambda: again.tracker.gpu_pod(NS, WORKERS[0]) is not None, timeout=15)
    end = run(again, 92, [3.0, 1.0], last + 7.0)  # still slow; then back: the slowdown ends
    assert again.writer.flush(10)
    assert [(e["kind"], e["iteration"]) for e in rows(db_url, "training_events")] == [
        ("training_slowdown", 61),
        ("training_stalled", 90),
        ("training_slowdown", 91),
    ]
    assert rows(db_url, "training_events")[2]["ended_at"].replace(tzinfo=UTC).timestamp() == end
    assert len(rows(db_url, "training_points")) == 4 * 93
    timeline = get(again, f"/v1/workloads/{uid}/timeline?start={int(t0)}&end={int(end) + 60}")
    assert [
        (e["type"], e["pod"], e["detail"].get("iteration", e["detail"].get("last_iteration")))
        for e in timeline["entries"]
        if e["type"].startswith("training")
    ] == [
        ("training_slowdown", WORKERS[0], 61),
        ("training_stalled", "", 90),
        ("training_slowdown", WORKERS[0], 91),
    ]
    # without Prometheus the timeline has the tables' entries and says what it lacks
    assert timeline["incomplete"] == [
        "recorder.prometheus.url is not set: this route needs " "Prometheus"
    ]


def test_bad_bodies_and_tokens_get_their_answers(
    api: FakeApiServer, recorder_app: Any, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    url = f"sqlite:///{tmp_path / 'r.db'}"
    app = started(api, recorder_app, url, ingest__token_file=str(token), logs__max_body_bytes=4096)
    good = fluent_bit(WORKERS[0], [megatron(1, 1000.0)], [1_700_000_000.0])
    auth = {"Authorization": "Bearer s3cret"}
    for headers, why in (
        ({}, "no bearer token"),
        ({"Authorization": "Bearer nope"}, "wrong"),
        ({"Authorization": "Basic czNjcmV0"}, "no bearer token"),
    ):
        r = post(app, good, headers=headers)
        assert r.status_code == 401 and r.json()["meta"]["code"] == 4010, r.text
        assert why in r.json()["meta"]["message"]
    assert metric(app, 'lens_recorder_post_unauthorized_total{route="/logs"}') == 3
    assert post(app, good, headers=auth).json()["data"]["parsed"] == 1
    token.write_text("rotated")  # a Secret's new token, read again
    assert post(app, good, headers=auth).status_code == 401
    auth = {"Authorization": "Bearer rotated"}
    cases = [
        (b"[1, 2", {}, 400, 4001, "not a JSON array"),
        (b"plain words", {}, 400, 4001, "plain lines need"),
        (b"\x1f\x8bnot gzip", {"Content-Encoding": "gzip"}, 400, 4001, "not gzip"),
        (json.dumps(good).encode(), {"Content-Encoding": "br"}, 415, 4015, "Content-Encoding"),
        (
            gzip.compress(b"[" + b" " * 100_000 + b"]"),
            {"Content-Encoding": "gzip"},
            413,
            4013,
            "once gunzipped",
        ),
        (json.dumps([{"log": "x"}, 5]).encode(), {}, 400, 4001, "no record taken"),
    ]
    for body, headers, status, code, why in cases:
        r = post(app, body, headers={**auth, **headers})
        assert (r.status_code, r.json()["meta"]["code"]) == (status, code), (why, r.text)
        assert why in r.json()["meta"]["message"]
    r = post(app, b"x" * 5000, headers=auth)  # over logs.max_body_bytes as sent
    assert r.status_code == 413
    # a malformed record among good ones: skipped and counted, the rest kept
    r = post(
        app, [{"log": "x"}, *fluent_bit(WORKERS[1], [megatron(1, 1000.0)], [1.7e9])], headers=auth
    )
    assert r.status_code == 200 and r.json()["data"]["malformed"] == 1
    assert "no kubernetes object" in r.json()["meta"]["message"]
    assert metric(app, "lens_recorder_log_records_malformed_total") == 3
    # GET routes are not POST routes, and the other way round
    r = requests.post(f"http://127.0.0.1:{app.http.port}/v1/nodes", timeout=hang_guard(5))
    assert r.status_code == 405
    r = requests.get(f"http://127.0.0.1:{app.http.port}/logs", timeout=hang_guard(5))
    assert r.status_code == 405  # a POST route
    # the service keeps serving
    assert get(app, "/v1/gpu-aggregation/clusters") == ["local"]


def test_beyond_loopback_without_a_token_no_post_is_taken(
    api: FakeApiServer, recorder_app: Any, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    app = started(api, recorder_app, url, listen="0.0.0.0:0")
    r = post(app, fluent_bit(WORKERS[0], [megatron(1, 1000.0)], [1.7e9]))
    assert r.status_code == 401 and "ingest.allow_anonymous" in r.json()["meta"]["message"]
    app.stop()
    opened = recorder_app(url, listen="0.0.0.0:0", ingest__allow_anonymous=True)
    eventually(lambda: opened.tracker.gpu_pod(NS, WORKERS[0]) is not None, timeout=15)
    r = post(opened, fluent_bit(WORKERS[0], [megatron(1, 1000.0)], [1.7e9]))
    assert r.status_code == 200 and r.json()["data"]["parsed"] == 1


def test_over_https_with_its_certificate(
    api: FakeApiServer, recorder_app: Any, tmp_path: Path
) -> None:
    import subprocess

    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    from lens_ebpf.k8s.client import api_client
    from lens_ebpf.recorder import config
    from lens_ebpf.recorder.service import RecorderApp

    bert(api)
    cfg = config.load(
        env={},
        overrides={
            ("recorder", "database_url"): f"sqlite:///{tmp_path / 'r.db'}",
            ("recorder", "listen"): "127.0.0.1:0",
            ("recorder", "collect_listen"): "",
            ("server", "tls", "cert"): str(cert),
            ("server", "tls", "key"): str(key),
        },
    )
    app = RecorderApp(cfg, api_client("kubeconfig", str(api.kubeconfig(tmp_path / "kc"))))
    app.start()
    try:
        eventually(lambda: app.tracker.gpu_pod(NS, WORKERS[0]) is not None, timeout=15)
        base = f"https://127.0.0.1:{app.http.port}"
        r = requests.post(
            base + "/logs",
            json=fluent_bit(WORKERS[0], [megatron(1, 1000.0)], [1.7e9]),
            verify=str(cert),
            timeout=hang_guard(10),
        )
        assert r.status_code == 200 and r.json()["data"]["parsed"] == 1
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(f"http://127.0.0.1:{app.http.port}/healthz", timeout=hang_guard(5))
    finally:
        app.stop(flush_timeout=2)


def test_a_token_file_that_appears_later(
    api: FakeApiServer, recorder_app: Any, tmp_path: Path
) -> None:
    token = tmp_path / "secret" / "token"  # the Secret is not there yet
    app = started(
        api, recorder_app, f"sqlite:///{tmp_path / 'r.db'}", ingest__token_file=str(token)
    )
    good = fluent_bit(WORKERS[0], [megatron(1, 1000.0)], [1.7e9])
    r = post(app, good, headers={"Authorization": "Bearer abc"})
    assert r.status_code == 401 and "holds no token" in r.json()["meta"]["message"]
    assert get(app, "/v1/gpu-aggregation/clusters") == ["local"]  # the rest runs
    token.parent.mkdir()
    token.write_text("abc\n")
    r = post(app, good, headers={"Authorization": "Bearer abc"})
    assert r.status_code == 200 and r.json()["data"]["parsed"] == 1


@pytest.mark.parametrize("shipper", ["fluent-bit", "fluent-bit-json-lines", "vector", "plain"])
def test_every_formats_lines_through_every_shipper(
    api: FakeApiServer, recorder_app: Any, tmp_path: Path, shipper: str
) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    app = started(api, recorder_app, url)
    files = (
        "megatron-single-node.log",
        "primus.log",
        "torchtitan.log",
        "hf_trainer.log",
        "deepspeed.log",
    )
    texts = [x for f in files for x in lines(f)]
    times = [1.7e9 + 13 * i for i in range(len(texts))]
    if shipper == "plain":
        r = post(
            app,
            gzip.compress("\n".join(texts).encode()),
            params={"namespace": NS, "pod": WORKERS[0]},
            headers={"Content-Encoding": "gzip"},
        )
    elif shipper == "vector":
        r = post(app, vector(WORKERS[0], texts, times))
    else:
        recs = fluent_bit(WORKERS[0], texts, times)
        r = post(app, recs if shipper == "fluent-bit" else "\n".join(json.dumps(x) for x in recs))
    assert r.status_code == 200, r.text
    assert r.json()["data"]["parsed"] == 23 and r.json()["data"]["malformed"] == 0
    assert app.writer.flush(10)
    got: dict[str, int] = {}
    for row in rows(url, "training_points"):
        got[row["format"]] = got.get(row["format"], 0) + 1
    assert got == {"megatron": 11, "torchtitan": 3, "hf_trainer": 5, "deepspeed": 4}
