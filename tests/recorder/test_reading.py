"""Reading what the recorder stored: the REST API (paginated, filtered, clear errors), the
--report table with exact GPU hours, the command line as a process, the migrations, the
kubelet Service, and the uninstall cleanup of finalizers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import create_engine, inspect, select

from lens_ebpf.recorder.store import queries
from tests.conftest import hang_guard
from tests.k8slab import FakeApiServer, eventually
from tests.recorder.conftest import rows
from tests.recorder.objects import (
    GPU1,
    GPU2,
    NS,
    U,
    conds,
    gpu_pod,
    has_finalizer,
    state,
    template,
    workload,
)

BIN = Path(sys.executable).parent
NOW = datetime(2026, 11, 23, 8, 0, tzinfo=UTC)  # T0 is 06:00
NV, AMD = "nvidia.com/gpu", "amd.com/gpu"


def populate(api: FakeApiServer) -> None:
    """A Deployment (2 pods, 1 GPU each, running), a CronJob's Job (one pod with 2 GPUs,
    finished), a PyTorchJob (3 pods, running)."""
    dep = {"replicas": 2, "template": template(NV, 1)}
    api.put("deployments", workload("trainer", dep, {"replicas": 2, "readyReplicas": 2}))
    api.put(
        "replicasets", workload("trainer-5d9f", dep, {"replicas": 2, "readyReplicas": 2}, "trainer")
    )
    for n in ("a", "b"):
        api.put(
            "pods",
            state(gpu_pod(f"trainer-5d9f-{n}", "trainer-5d9f", NV, 1, GPU1), "Running", True),
        )
    job = {"parallelism": 1, "template": template(AMD, 2)}
    api.put("cronjobs", workload("nightly", {"jobTemplate": {"spec": job}}, {"active": []}))
    api.put("jobs", workload("nightly-29000", job, conds("Complete"), "nightly"))
    x = gpu_pod("nightly-29000-x", "nightly-29000", AMD, 2, GPU2)
    api.put("pods", state(x, "Running", True))
    api.put("pods", state(x, "Succeeded", False))
    pt = {"pytorchReplicaSpecs": {"Worker": {"replicas": 3, "template": template(NV, 1)}}}
    api.put("pytorchjobs", workload("bert", pt, conds("Created", "Running")))
    for n in range(3):
        api.put("pods", state(gpu_pod(f"bert-worker-{n}", "bert", NV, 1, GPU1), "Running", True))


def early_job(api: FakeApiServer) -> None:
    """A Job created before the others (it sorts first), with one GPU pod."""
    job = workload("nightly-29000", {"parallelism": 1, "template": template(AMD, 1)}, {})
    job["metadata"].update(
        name="early", uid="uid-aaa-early", creationTimestamp="2026-11-22T00:00:00Z"
    )
    api.put("jobs", job)
    p = gpu_pod("early-x", "nightly-29000", AMD, 1, "gpu-3")
    p["metadata"]["ownerReferences"][0].update(name="early", uid="uid-aaa-early")
    api.put("pods", state(p, "Running", True))


def get(app: Any, path: str) -> requests.Response:
    return requests.get(f"http://127.0.0.1:{app.http.port}{path}", timeout=hang_guard(5))


def test_rest_pages_filters_and_errors(api: FakeApiServer, recorder_app: Any, db_url: str) -> None:
    populate(api)
    app = recorder_app(db_url, clock=lambda: NOW, page_max=50)
    eventually(lambda: len(rows(db_url, "gpu_pods")) == 6, timeout=10)
    assert app.writer.flush(10)

    top = get(app, "/workloads?top=true").json()
    assert [w["name"] for w in top["items"]] == ["bert", "nightly", "trainer"] or sorted(
        w["name"] for w in top["items"]
    ) == ["bert", "nightly", "trainer"]
    assert "continue" not in top
    # pages of two: three pages for five workloads, each row once, even when a workload
    # that sorts first is recorded between two pages (an offset would serve a row twice)
    seen, token, pages = [], "", 0
    while True:
        page = get(app, f"/workloads?limit=2&continue={token}").json()
        seen += [w["uid"] for w in page["items"]]
        pages += 1
        token = page.get("continue", "")
        if pages == 1:
            early_job(api)
            eventually(lambda: len(rows(db_url, "gpu_workloads")) == 6, timeout=10)
        if not token:
            break
    assert pages == 3 and sorted(seen) == sorted(U.values())
    assert len(get(app, "/workloads?limit=50").json()["items"]) == 6
    running = get(app, "/workloads?running=false").json()["items"]  # the early Job runs
    assert [w["name"] for w in running] == ["nightly-29000"]
    assert [w["name"] for w in get(app, "/workloads?kind=PyTorchJob").json()["items"]] == ["bert"]

    one = get(app, f"/workloads/{U['bert']}").json()
    assert (one["kind"], one["gpu_request"], one["status"]) == ("PyTorchJob", 3, "Running")
    assert [p["name"] for p in one["pods"]] == [f"bert-worker-{n}" for n in range(3)]
    assert one["pods"][0]["resources"] == [
        {
            "container": "main",
            "source": "spec",
            "resource": NV,
            "count": 1,
            "model": "",
            "devices": [],
        }
    ]
    assert [e["type"] for e in one["pods"][0]["events"]] == ["created", "condition"]
    cj = get(app, f"/workloads/{U['nightly']}").json()
    assert [c["name"] for c in cj["children"]] == ["nightly-29000"]

    on2 = get(app, f"/pods?node={GPU2}").json()["items"]
    assert [(p["name"], p["phase"], p["gpus"]) for p in on2] == [
        ("nightly-29000-x", "Succeeded", 2)
    ]
    # the finished pod ended at 08:00 (the recorder's clock): not alive since 08:30
    alive = get(app, "/pods?since=2026-11-23T08:30:00Z").json()["items"]
    assert sorted(p["name"] for p in alive) == [
        "bert-worker-0",
        "bert-worker-1",
        "bert-worker-2",
        "early-x",
        "trainer-5d9f-a",
        "trainer-5d9f-b",
    ]
    assert len(get(app, "/pods?since=1800000000").json()["items"]) == 6  # Unix seconds

    for path, code, says in (
        ("/workloads?limit=0", 400, "limit=0: must be from 1 to 50"),
        ("/workloads?limit=51", 400, "limit=51"),
        ("/workloads?limit=x", 400, "limit='x': not a"),
        ("/workloads?continue=garbage", 400, "continue: not a token"),
        ("/workloads?running=maybe", 400, "running='maybe': true or false"),
        ("/pods?since=yesterday", 400, "since='yesterday'"),
        ("/workloads/no-such-uid", 404, "no workload no-such-uid"),
        ("/pods/x", 404, "no route"),
    ):
        r = get(app, path)
        assert r.status_code == code and says in r.json()["error"], path


def test_report_counts_gpu_hours_exactly(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    populate(api)
    app = recorder_app(db_url, clock=lambda: NOW)
    eventually(lambda: len(rows(db_url, "gpu_pods")) == 6, timeout=10)
    assert app.writer.flush(10)
    eng = create_engine(db_url)
    with eng.connect() as conn:
        since = datetime(2026, 11, 23, 0, 0, tzinfo=UTC)
        later = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
        lines = {x.name: x for x in queries.report(conn, since, later)}
        # started 06:00 (status.startTime); the Job's pod ended 08:00; the rest run at 10:00
        assert {n: (x.kind, x.pods, x.gpus, x.gpu_seconds / 3600) for n, x in lines.items()} == {
            "trainer": ("Deployment", 2, 2, 2 * 4.0),
            "nightly": ("CronJob", 1, 2, 2 * 2.0),
            "bert": ("PyTorchJob", 3, 3, 3 * 4.0),
        }
        # counted from since, and only pods on the node asked for
        on2 = queries.report(conn, datetime(2026, 11, 23, 7, 0, tzinfo=UTC), later, GPU2)
        assert [(x.name, x.gpu_seconds / 3600) for x in on2] == [("nightly", 2 * 1.0)]
        assert queries.report(conn, datetime(2026, 11, 23, 9, 0, tzinfo=UTC), later, GPU2) == []
        text = queries.format_report(list(lines.values()))
    eng.dispose()
    assert text.splitlines()[0].split() == [
        "WORKLOAD",
        "STATUS",
        "GPUS",
        "PODS",
        "CREATED",
        "ENDED",
        "GPU-H",
    ]
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "PyTorchJob/ml/bert" in text and "12.00" in text


def run_cli(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "lens-ebpf"), "recorder", *args],
        env=env,
        timeout=timeout,
        capture_output=True,
        text=True,
    )


def test_the_command_line(api: FakeApiServer, tmp_path: Path) -> None:
    populate(api)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LENS_")}
    env["KUBECONFIG"] = str(api.kubeconfig(tmp_path / "kubeconfig"))
    db = f"sqlite:///{tmp_path / 'rec.db'}"
    with socket_pair() as (http_port, collect_port):
        proc = subprocess.Popen(
            [
                str(BIN / "lens-ebpf"),
                "recorder",
                "--database",
                db,
                "--listen",
                f"127.0.0.1:{http_port}",
                "--collect-listen",
                f"127.0.0.1:{collect_port}",
            ],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        url = f"http://127.0.0.1:{http_port}"

        def ready() -> bool:
            try:
                return requests.get(url + "/readyz", timeout=hang_guard(1)).status_code == 200
            except requests.ConnectionError:
                return False

        eventually(ready, timeout=30)
        eventually(
            lambda: len(requests.get(url + "/pods", timeout=hang_guard(2)).json()["items"]) == 6,
            timeout=15,
        )
        eventually(lambda: all(has_finalizer(api, n) for n in U), timeout=15)
        assert "lens_recorder_db_write_seconds_bucket" in requests.get(url + "/metrics").text
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=hang_guard(30))
    assert proc.returncode == 0, err

    out = run_cli("--report", "--database", db, "--since", "2026-11-23T00:00:00Z", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].startswith("WORKLOAD") and len(out.stdout.splitlines()) == 4
    js = run_cli("--report", "--json", "--node", GPU2, "--database", db, "--since", "30d", env=env)
    assert [json.loads(line)["name"] for line in js.stdout.splitlines()] == ["nightly"]

    # uninstall: every finalizer comes off
    cleaned = run_cli("--remove-finalizers", "--database", db, env=env)
    assert cleaned.returncode == 0, cleaned.stderr
    assert "Deployment: 1 finalizers removed" in cleaned.stdout
    assert "PyTorchJob: 1 finalizers removed" in cleaned.stdout
    assert not any(has_finalizer(api, n) for n in U)

    for args, says in (
        (["--database", "nosuch://x"], "recorder: database_url nosuch://x"),
        (["--report", "--database", db, "--since", "soon"], "since='soon'"),
        (["--listen", "nowhere"], "--listen 'nowhere'"),
        (
            ["--report", "--database", f"sqlite:///{tmp_path / 'none.db'}"],
            "no recorder database at",
        ),
        (
            ["--database", "postgresql+psycopg://lens:hunter2@127.0.0.1:1/lens"],
            "recorder: cannot start: OperationalError",
        ),
    ):
        bad = run_cli(*args, env=env)
        assert bad.returncode == 2 and says in bad.stderr, (args, bad.stderr)
        assert "hunter2" not in bad.stderr
    # replicas need a database they share: SQLite with leader election is refused, in a line
    replicas = {**env, "LENS_RECORDER__LEADER_ELECTION__ENABLED": "true"}
    bad = run_cli("--database", db, env=replicas)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "leader_election.enabled needs a database the replicas share (PostgreSQL)" in bad.stderr
    noapi = {k: v for k, v in env.items() if k != "KUBECONFIG"}
    bad = run_cli("--database", db, env=noapi)
    assert bad.returncode == 2
    assert bad.stderr.startswith("lens-ebpf: error: recorder: needs the Kubernetes API (")


class socket_pair:  # noqa: N801 (used as a context manager)
    """Two free TCP ports (released before the recorder binds them)."""

    def __enter__(self) -> tuple[int, int]:
        import socket

        self.socks = [socket.socket() for _ in range(2)]
        for s in self.socks:
            s.bind(("127.0.0.1", 0))
        return self.socks[0].getsockname()[1], self.socks[1].getsockname()[1]

    def __exit__(self, *exc: Any) -> None:
        for s in self.socks:
            s.close()


def test_migrations_build_exactly_the_schema(db_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from lens_ebpf.recorder.store import schema
    from lens_ebpf.recorder.store.writer import engine_for, upgrade

    eng = engine_for(db_url)
    assert upgrade(eng) == "0014"
    assert upgrade(eng) == "0014"  # again: nothing to do
    with eng.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), schema.metadata)
        assert diff == []
        names = set(inspect(conn).get_table_names())
    assert names == set(schema.TABLES) | set(schema.SERVICE_TABLES) | {"alembic_version"}
    eng.dispose()


def test_rows_stored_before_clusters_belong_to_the_home_cluster(db_url: str) -> None:
    """0007 on a database of 0006 with rows: each row keeps its values and gains the
    home cluster; a second cluster may then hold the same node name and pod UID. 0014:
    an agent event stored before is instance "", and another agent instance of the node
    may hold the same seq (each agent process numbers from 1)."""
    from datetime import UTC, datetime

    from sqlalchemy import text
    from sqlalchemy.exc import IntegrityError

    from lens_ebpf.recorder.store import schema
    from lens_ebpf.recorder.store.writer import engine_for, upgrade

    eng = engine_for(db_url)
    assert upgrade(eng, target="0006") == "0006"
    at = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
    with eng.begin() as conn:  # as 0006 wrote them (no cluster column yet)
        conn.execute(
            text(
                "INSERT INTO nodes (name, address, status, gpu_capacity, "
                "gpu_allocatable, labels, cpu_count, memory_bytes, memory, kernel, "
                "os_image, kubelet_version, container_runtime, taints, deleted, "
                "updated_at) VALUES ('gpu-0', '10.0.0.1', 'Ready', '{}', '{}', "
                "'{}', 8, 0, '', '', '', '', '', 0, false, :at)"
            ),
            {"at": at},
        )
        conn.execute(
            text(
                "INSERT INTO node_events (node, seq, at, kind, namespace, pod, "
                "pod_uid, container, payload) VALUES ('gpu-0', 7, :at, 'oom_kill', "
                "'', '', '', '', '{}')"
            ),
            {"at": at},
        )
    # the newest migration is the head (their files are numbered in order)
    versions = Path(__file__).resolve().parents[2] / "lens_ebpf/recorder/store/migrations/versions"
    head = max(p.name[:4] for p in versions.glob("[0-9][0-9][0-9][0-9]_*.py"))
    assert upgrade(eng, cluster="home") == head
    with eng.begin() as conn:
        assert [
            tuple(r)
            for r in conn.execute(
                select(schema.nodes.c.cluster, schema.nodes.c.name, schema.nodes.c.address)
            )
        ] == [("home", "gpu-0", "10.0.0.1")]
        ne = schema.node_events
        assert [
            tuple(r) for r in conn.execute(select(ne.c.cluster, ne.c.node, ne.c.instance, ne.c.seq))
        ] == [("home", "gpu-0", "", 7)]
        row = {"node": "gpu-0", "seq": 7, "at": at, "kind": "oom_kill", "payload": {}}
        conn.execute(ne.insert().values(cluster="b", **row))  # the same (node, seq) in b
        conn.execute(ne.insert().values(cluster="home", instance="a1", **row))  # a restart's
    with pytest.raises(IntegrityError), eng.begin() as conn:  # the same instance's seq: once
        conn.execute(ne.insert().values(cluster="home", instance="a1", **row))
    with eng.begin() as conn:
        conn.execute(
            schema.nodes.insert().values(
                cluster="b",
                name="gpu-0",
                gpu_capacity={},
                gpu_allocatable={},
                labels={},
                updated_at=at,
            )
        )
        assert conn.execute(
            select(schema.nodes.c.cluster).order_by(schema.nodes.c.cluster)
        ).scalars().all() == ["b", "home"]
    eng.dispose()


def test_the_kubelet_service_follows_the_nodes(
    api: FakeApiServer, recorder_app: Any, tmp_path: Path
) -> None:
    def node(name: str, ip: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "uid": f"uid-{name}"},
            "status": {
                "addresses": [
                    {"type": "Hostname", "address": name},
                    {"type": "InternalIP", "address": ip},
                ]
            },
        }

    api.put("nodes", node("gpu-2", "192.0.2.12"))
    api.put("nodes", node("gpu-1", "192.0.2.11"))
    app = recorder_app(
        f"sqlite:///{tmp_path / 'k.db'}",
        kubelet_service__enabled=True,
        kubelet_service__interval_seconds=0.2,
    )

    def ips() -> list[str]:
        ep = api.get("endpoints", "kube-system", "kubelet")
        return [a["ip"] for s in (ep or {}).get("subsets") or () for a in s["addresses"]]

    eventually(lambda: ips() == ["192.0.2.11", "192.0.2.12"], timeout=10)
    svc = api.get("services", "kube-system", "kubelet")
    assert svc["spec"]["clusterIP"] == "None"
    assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [
        ("cadvisor", 4194),
        ("http-metrics", 10255),
        ("https-metrics", 10250),
    ]
    ep = api.get("endpoints", "kube-system", "kubelet")
    assert ep["subsets"][0]["addresses"][0]["targetRef"] == {
        "kind": "Node",
        "name": "gpu-1",
        "uid": "uid-gpu-1",
    }
    api.put("nodes", node("gpu-3", "192.0.2.13"))
    eventually(lambda: ips() == ["192.0.2.11", "192.0.2.12", "192.0.2.13"], timeout=10)
    api.delete("nodes", "", "gpu-1")
    eventually(lambda: ips() == ["192.0.2.12", "192.0.2.13"], timeout=10)
    # a sync is counted once its writes return: the API may show them a moment before
    eventually(lambda: app.kubelet.syncs["updated"] == 2, timeout=10)
    assert app.kubelet.syncs["created"] == 1
    assert app.kubelet.syncs["error"] == 0


@pytest.mark.parametrize("since", ["12h", "90s", "7d", "1795000000", "2026-11-01T00:00:00Z"])
def test_since_forms(since: str) -> None:
    got = queries.parse_since(since, NOW)
    assert got.tzinfo is not None and got < NOW
    assert NS == "ml"  # the objects' namespace, used across these tests
