"""The recorder's pure parts: what a pod requests, what of it a snapshot keeps, what changed
between snapshots, a workload's GPU request and status, page tokens, node event rows, the
kubelet Endpoints, and a writer that drops (and counts) a write the database refuses."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from lens_ebpf.core.settings import ConfigError, split_listen
from lens_ebpf.k8s.objects import ObjectError
from lens_ebpf.protocol.gen import lens_pb2 as pb
from lens_ebpf.recorder import lifecycle as lc
from lens_ebpf.recorder.ingest.node_events import agent_resources, event_row
from lens_ebpf.recorder.store import queries
from lens_ebpf.recorder.store.writer import Op, Writer, engine_for, redact, upgrade
from lens_ebpf.recorder.tracker.kubelet_service import node_addresses

GPUS = ["amd.com/gpu", "nvidia.com/gpu"]


def c(name: str, **limits: str) -> dict[str, Any]:
    return {"name": name, "resources": {"limits": dict(limits)}}


def tmpl(*containers: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"containers": list(containers)}}


def test_gpu_requests_use_the_effective_request_rule() -> None:
    pod = {
        "metadata": {"name": "p", "uid": "u"},
        "spec": {
            "initContainers": [c("init", **{"nvidia.com/gpu": "4"})],
            "containers": [c("a", **{"nvidia.com/gpu": "1"}), c("b", **{"nvidia.com/gpu": "2"})],
        },
    }
    assert lc.gpu_requests(pod, GPUS) == {"nvidia.com/gpu": 4}  # the init step is larger
    with pytest.raises(ObjectError, match="not a whole number"):
        lc.gpu_requests(
            {
                "metadata": {"name": "p", "uid": "u"},
                "spec": {"containers": [c("a", **{"amd.com/gpu": "0.5"})]},
            },
            GPUS,
        )
    with pytest.raises(ObjectError, match="metadata.name and metadata.uid"):
        lc.gpu_requests({"metadata": {"name": "p"}, "spec": {}}, GPUS)


def test_a_snapshot_keeps_what_matters_and_no_secret() -> None:
    pod = {
        "metadata": {
            "name": "p",
            "uid": "u",
            "resourceVersion": "9",
            "managedFields": [{}],
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{..}",
                "team": "nlp",
            },
        },
        "spec": {
            "containers": [
                {
                    "name": "m",
                    "env": [{"name": "K", "value": "secret"}, {"name": "P", "valueFrom": {}}],
                    "envFrom": [{"secretRef": {"name": "s"}}],
                }
            ],
            "volumes": [{"name": "v", "secret": {"secretName": "s", "items": [{"key": "k"}]}}],
        },
        "status": {"conditions": [{"type": "Ready", "status": "True", "lastProbeTime": "t"}]},
    }
    snap = lc.snapshot(pod)
    assert snap["metadata"] == {"name": "p", "uid": "u", "annotations": {"team": "nlp"}}
    assert snap["spec"]["containers"] == [{"name": "m", "env": [{"name": "K"}, {"name": "P"}]}]
    assert snap["spec"]["volumes"] == [{"name": "v", "secret": {"secretName": "s"}}]
    assert snap["status"]["conditions"] == [{"type": "Ready", "status": "True"}]
    assert pod["spec"]["containers"][0]["env"][0]["value"] == "secret"  # the input is untouched
    # a new resourceVersion alone is no change
    assert lc.snapshot({**pod, "metadata": {**pod["metadata"], "resourceVersion": "10"}}) == snap


def test_changes_between_snapshots() -> None:
    def s(phase: str, ready: str | None = None, restarts: int = 0) -> dict[str, Any]:
        st: dict[str, Any] = {"phase": phase}
        if ready:
            st["conditions"] = [{"type": "Ready", "status": ready}]
            st["containerStatuses"] = [{"name": "m", "restartCount": restarts}]
        return {"status": st}

    assert lc.pod_changes(None, s("Pending")) == [lc.Change("created", "", "", "Pending")]
    assert lc.pod_changes(s("Pending"), s("Running", "True")) == [
        lc.Change("phase", "", "Pending", "Running"),
        lc.Change("condition", "Ready", "", "True"),
    ]
    assert lc.pod_changes(s("Running", "True"), s("Running", "True", 2)) == [
        lc.Change("restart", "m", "0", "2")
    ]
    assert lc.pod_changes(s("Running", "True", 2), s("Running", "True", 2)) == []


def test_workload_requests_walk_every_pod_template() -> None:
    nv, amd = "nvidia.com/gpu", "amd.com/gpu"
    one = tmpl(c("m", **{nv: "1"}))
    assert lc.workload_request({"spec": {"replicas": 3, "template": one}}, GPUS) == {nv: 3}
    assert lc.workload_request({"spec": {"parallelism": 2, "template": one}}, GPUS) == {nv: 2}
    cron = {
        "spec": {
            "jobTemplate": {"spec": {"parallelism": 4, "template": tmpl(c("m", **{amd: "2"}))}}
        }
    }
    assert lc.workload_request(cron, GPUS) == {amd: 8}
    pt = {
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": one},
                "Worker": {"replicas": 4, "template": one},
            }
        }
    }
    assert lc.workload_request(pt, GPUS) == {nv: 5}
    ray = {
        "spec": {
            "rayClusterSpec": {
                "headGroupSpec": {"template": tmpl(c("h"))},
                "workerGroupSpecs": [
                    {"replicas": 2, "template": one},
                    {"replicas": 1, "template": tmpl(c("w", **{amd: "8"}))},
                ],
            }
        }
    }
    assert lc.workload_request(ray, GPUS) == {nv: 2, amd: 8}
    assert lc.workload_request({"spec": {"replicas": 0, "template": one}}, GPUS) == {}


@pytest.mark.parametrize(
    ("obj", "status", "ended"),
    [
        (
            {
                "kind": "Job",
                "status": {
                    "conditions": [
                        {
                            "type": "Complete",
                            "status": "True",
                            "lastTransitionTime": "2026-11-23T07:00:00Z",
                        }
                    ]
                },
            },
            "Complete",
            True,
        ),
        ({"kind": "Job", "status": {"active": 1}}, "Running", False),
        ({"kind": "Job", "status": {}}, "Pending", False),
        ({"kind": "Deployment", "status": {"replicas": 2, "readyReplicas": 1}}, "Running", False),
        ({"kind": "StatefulSet", "status": {"replicas": 2}}, "Pending", False),
        ({"kind": "CronJob", "status": {"active": [{"name": "j"}]}}, "Active", False),
        (
            {
                "kind": "PyTorchJob",
                "status": {
                    "conditions": [
                        {"type": "Created", "status": "True"},
                        {"type": "Running", "status": "False"},
                        {"type": "Restarting", "status": "True"},
                    ]
                },
            },
            "Restarting",
            False,
        ),
        (
            {
                "kind": "PyTorchJob",
                "status": {"conditions": [{"type": "Failed", "status": "True"}]},
            },
            "Failed",
            True,
        ),
    ],
)
def test_workload_status(obj: dict[str, Any], status: str, ended: bool) -> None:
    got, when = lc.workload_status(obj)
    assert (got, when is not None) == (status, ended)


def test_page_tokens_and_their_errors() -> None:
    p = queries.page_of({"limit": "5"}, 10)
    assert (p.limit, p.after) == (5, None)
    with pytest.raises(queries.QueryError, match="must be from 1 to 10"):
        queries.page_of({"limit": "11"}, 10)
    with pytest.raises(queries.QueryError, match="not a token"):
        queries.page_of({"continue": "eyJ4IjogMX0="}, 10)  # {"x": 1}


def test_node_event_rows_and_the_gpus_a_container_got() -> None:
    ev = pb.Event(
        seq=7,
        ts_unix_nano=1_795_000_000_000_000_000,
        container_start=pb.ContainerChange(
            identity=pb.Identity(pod="p", namespace="ml", pod_uid="u", container="m"),
            devices=["/dev/nvidia1", "/dev/nvidiactl", "/dev/dri/renderD128", "/dev/dri/card0"],
        ),
    )
    row = event_row("local", "gpu-1", ev)
    assert (row["node"], row["seq"], row["kind"], row["pod_uid"], row["container"]) == (
        "gpu-1",
        7,
        "container_start",
        "u",
        "m",
    )
    assert row["at"].timestamp() == 1_795_000_000
    res = agent_resources("local", ev, row["at"])
    got = [(r["resource"], r["count"], r["devices"]) for r in res]
    assert got == [
        ("amd.com/gpu", 1, ["/dev/dri/renderD128"]),
        ("nvidia.com/gpu", 1, ["/dev/nvidia1"]),
    ]
    gap = event_row("local", "gpu-1", pb.Event(seq=9, gap=pb.Gap(lost=3, reason="reporter_buffer")))
    assert (gap["seq"], gap["kind"], gap["payload"]) == (
        None,
        "gap",
        {"lost": "3", "reason": "reporter_buffer"},
    )


def test_kubelet_endpoints_take_each_nodes_internal_ip() -> None:
    nodes = {
        "items": [
            {
                "metadata": {"name": "b", "uid": "ub"},
                "status": {
                    "addresses": [
                        {"type": "Hostname", "address": "b"},
                        {"type": "ExternalIP", "address": "203.0.113.2"},
                    ]
                },
            },
            {
                "metadata": {"name": "a", "uid": "ua"},
                "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]},
            },
            {"metadata": {"name": "c"}, "status": {}},  # no address yet: left out
            "garbage",
        ]
    }
    assert [(a["nodeName"], a["ip"]) for a in node_addresses(nodes)] == [
        ("a", "10.0.0.1"),
        ("b", "203.0.113.2"),
    ]


def test_urls_are_redacted_in_messages() -> None:
    assert (
        redact("postgresql+psycopg://lens:hunter2@db:5432/lens")
        == "postgresql+psycopg://lens:***@db:5432/lens"
    )
    assert redact("sqlite:///x.db") == "sqlite:///x.db"


def test_a_refused_or_failing_write_is_dropped_counted_and_the_rest_go_on(tmp_path: Path) -> None:
    eng = engine_for(f"sqlite:///{tmp_path / 'w.db'}")
    upgrade(eng)
    w = Writer(eng, queue_max=10)
    stop = threading.Event()

    insert = (
        "INSERT INTO node_events (cluster, node, seq, at, kind, namespace, pod, "
        "pod_uid, container, payload) VALUES ('local', 'n', {}, '2026-11-23 07:00:00', "
        "'x', '', '', '', '', '{{}}')"
    )

    def good(n: int) -> Op:
        return Op("node_events", lambda conn: conn.execute(text(insert.format(n))) and None)

    bad = Op(
        "gpu_pods",
        lambda conn: conn.execute(text("INSERT INTO gpu_pods (uid) VALUES ('x')")) and None,
    )

    def broken(conn: object) -> None:  # the write's own code fails, not the database
        raise TypeError("Object of type set is not JSON serializable")

    for op in (good(1), bad, Op("training_points", broken), good(2)):
        assert w.submit(op)
    w.start(stop)
    assert w.flush(10)
    stop.set()
    w.join(5)
    assert (w.committed, w.errors["rejected"], w.dropped) == (2, 2, 0)
    assert w.last_error == "training_points: TypeError: Object of type set is not JSON serializable"
    with eng.connect() as conn:
        assert [r[0] for r in conn.execute(text("SELECT seq FROM node_events"))] == [1, 2]
    full = Writer(eng, queue_max=1)
    assert full.submit(good(3)) and not full.submit(good(4))
    assert full.dropped == 1


def test_a_bad_recorder_listen_address_is_refused_naming_the_key() -> None:
    from lens_ebpf.recorder import config

    with pytest.raises(ConfigError, match=r"recorder\.listen: .*HOST:PORT.*'nowhere'"):
        config.load(env={"LENS_RECORDER__LISTEN": "nowhere"})
    assert split_listen("[::1]:9480") == ("::1", 9480)
    assert split_listen(":9480") == ("0.0.0.0", 9480)
