"""A Deployment, a Job under a CronJob and a PyTorchJob, with GPU pods, through create ->
run -> fail/restart -> finish -> delete, with a recorder restart in the middle: every
table holds exactly the expected rows, and the finalizer is added and removed."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import requests

from tests.conftest import hang_guard
from tests.k8slab import FakeApiServer, eventually, pod
from tests.recorder.conftest import rows
from tests.recorder.objects import (
    GPU1,
    GPU2,
    H100,
    MI300,
    NS,
    U,
    conds,
    delete_workload,
    gone,
    gpu_pod,
    has_finalizer,
    state,
    template,
    workload,
)


def test_three_workloads_from_creation_to_deletion(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    api.put("nodes", {"metadata": {"name": GPU1, "labels": {"nvidia.com/gpu.product": H100}}})
    api.put("nodes", {"metadata": {"name": GPU2, "labels": {"amd.com/gpu.product-name": MI300}}})
    api.put("pods", pod("web", "10.244.0.9", NS))  # no GPUs: not recorded
    bad = gpu_pod("broken", "trainer", "nvidia.com/gpu", 1, GPU1)
    bad["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "half"
    api.put("pods", bad)  # malformed: counted, skipped
    app = recorder_app(db_url)

    # -- a Deployment with two GPU pods; one restarts ----------------------------------
    nv = "nvidia.com/gpu"
    dep_spec = {"replicas": 2, "template": template(nv, 1)}
    api.put("deployments", workload("trainer", dep_spec, {"replicas": 2, "readyReplicas": 0}))
    api.put(
        "replicasets",
        workload("trainer-5d9f", dep_spec, {"replicas": 2, "readyReplicas": 0}, "trainer"),
    )
    a = gpu_pod("trainer-5d9f-a", "trainer-5d9f", nv, 1, GPU1)
    b = gpu_pod("trainer-5d9f-b", "trainer-5d9f", nv, 1, GPU1)
    for p in (a, b):
        api.put("pods", p)
        api.put("pods", state(p, "Running", True))
    api.put("pods", state(a, "Running", False, restarts=1))
    api.put("pods", state(a, "Running", True, restarts=1))
    api.put("deployments", workload("trainer", dep_spec, {"replicas": 2, "readyReplicas": 2}))
    api.put(
        "replicasets",
        workload("trainer-5d9f", dep_spec, {"replicas": 2, "readyReplicas": 2}, "trainer"),
    )

    # -- a CronJob's Job: the first pod fails, the retry runs -----------------------------
    amd = "amd.com/gpu"
    job_spec = {"parallelism": 1, "template": template(amd, 2)}
    cj_spec = {"schedule": "0 2 * * *", "jobTemplate": {"spec": job_spec}}
    api.put("cronjobs", workload("nightly", cj_spec, {"active": [{"name": "nightly-29000"}]}))
    api.put("jobs", workload("nightly-29000", job_spec, {"active": 1}, "nightly"))
    x = gpu_pod("nightly-29000-x", "nightly-29000", amd, 2, GPU2)
    y = gpu_pod("nightly-29000-y", "nightly-29000", amd, 2, GPU2)
    api.put("pods", x)
    api.put("pods", state(x, "Running", True))
    api.put("pods", state(x, "Failed", False))
    api.put("pods", y)
    api.put("pods", state(y, "Running", True))

    # -- a PyTorchJob: one master, two workers -------------------------------------------
    pt_spec = {
        "pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "template": template(nv, 1)},
            "Worker": {"replicas": 2, "template": template(nv, 1)},
        }
    }
    api.put("pytorchjobs", workload("bert", pt_spec, conds("Created")))
    bert = [
        gpu_pod(n, "bert", nv, 1, GPU1) for n in ("bert-master-0", "bert-worker-0", "bert-worker-1")
    ]
    for p in bert:
        api.put("pods", p)
        api.put("pods", state(p, "Running", True))
    api.put("pytorchjobs", workload("bert", pt_spec, conds("Created", "Running")))

    # every workload is tracked and carries the finalizer
    eventually(lambda: all(has_finalizer(api, n) for n in U), timeout=15)
    assert app.writer.flush(10)
    eventually(lambda: len(rows(db_url, "gpu_pods")) == 7, timeout=10)
    eventually(lambda: all(r["finalizer"] for r in rows(db_url, "gpu_workloads")), timeout=10)
    metrics = requests.get(f"http://127.0.0.1:{app.http.port}/metrics", timeout=hang_guard(5)).text
    assert 'lens_recorder_malformed_objects_total{resource="pods"} 1.0' in metrics
    assert 'lens_recorder_finalizer_operations_total{operation="add",result="ok"} 5.0' in metrics
    assert "lens_recorder_workloads_watched 5.0" in metrics

    # -- the recorder stops; meanwhile a worker restarts, the Job finishes, and the
    #    Deployment is deleted (its finalizer holds it) ------------------------------------
    app.stop()
    api.put("pods", state(bert[2], "Running", True, restarts=1))
    api.put(
        "pytorchjobs", workload("bert", pt_spec, conds("Created", "Restarting", false=("Running",)))
    )
    api.put("pods", state(y, "Succeeded", False))
    api.put(
        "jobs",
        workload(
            "nightly-29000", job_spec, {"active": 0, "succeeded": 1, **conds("Complete")}, "nightly"
        ),
    )
    api.put("cronjobs", workload("nightly", cj_spec, {"active": []}))
    api.request_delete("deployments", NS, "trainer")
    assert not gone(api, "trainer")

    app = recorder_app(db_url)
    eventually(lambda: gone(api, "trainer"), timeout=15)  # final state stored, finalizer off
    # the controllers' garbage collection, played by the test
    delete_workload(api, "trainer-5d9f")
    for p in (a, b):
        api.delete("pods", NS, p["metadata"]["name"])
    api.put("pytorchjobs", workload("bert", pt_spec, conds("Created", "Running")))
    for p in bert:
        api.put("pods", state(p, "Succeeded", False, restarts=1 if p is bert[2] else 0))
    api.put(
        "pytorchjobs", workload("bert", pt_spec, conds("Created", "Succeeded", false=("Running",)))
    )
    delete_workload(api, "bert")
    for p in bert:
        api.delete("pods", NS, p["metadata"]["name"])
    delete_workload(api, "nightly-29000")
    for p in (x, y):
        api.delete("pods", NS, p["metadata"]["name"])
    delete_workload(api, "nightly")
    eventually(lambda: all(r["deleted"] for r in rows(db_url, "gpu_pods")), timeout=15)
    eventually(lambda: not any(r["finalizer"] for r in rows(db_url, "gpu_workloads")), timeout=10)
    assert app.writer.flush(10)

    # -- gpu_workloads ---------------------------------------------------------------------
    got = {r["name"]: r for r in rows(db_url, "gpu_workloads")}
    want = {  # name: (kind, apiVersion, parent, GPUs, status)
        "trainer": ("Deployment", "apps/v1", None, {nv: 2}, "Running"),
        "trainer-5d9f": ("ReplicaSet", "apps/v1", U["trainer"], {nv: 2}, "Running"),
        "nightly": ("CronJob", "batch/v1", None, {amd: 2}, "Scheduled"),
        "nightly-29000": ("Job", "batch/v1", U["nightly"], {amd: 2}, "Complete"),
        "bert": ("PyTorchJob", "kubeflow.org/v1", None, {nv: 3}, "Succeeded"),
    }
    assert set(got) == set(want)
    for name, (kind, api_version, parent, gpus, status) in want.items():
        r = got[name]
        assert (
            r["uid"],
            r["kind"],
            r["api_version"],
            r["namespace"],
            r["parent_uid"],
            r["gpu_resources"],
            r["gpu_request"],
            r["status"],
        ) == (U[name], kind, api_version, NS, parent, gpus, sum(gpus.values()), status), name
        assert (r["running"], r["deleted"], r["finalizer"], r["labels"]) == (
            False,
            True,
            False,
            {"app": name},
        ), name
        assert r["created_at"] is not None and r["deleted_at"] is not None
        assert r["ended_at"] is not None, name

    # -- gpu_pods ------------------------------------------------------------------------
    pods = {r["name"]: r for r in rows(db_url, "gpu_pods")}
    want_pods = {  # name: (node, GPUs, final phase, top workload)
        "trainer-5d9f-a": (GPU1, {nv: 1}, "Running", "trainer"),
        "trainer-5d9f-b": (GPU1, {nv: 1}, "Running", "trainer"),
        "nightly-29000-x": (GPU2, {amd: 2}, "Failed", "nightly"),
        "nightly-29000-y": (GPU2, {amd: 2}, "Succeeded", "nightly"),
        "bert-master-0": (GPU1, {nv: 1}, "Succeeded", "bert"),
        "bert-worker-0": (GPU1, {nv: 1}, "Succeeded", "bert"),
        "bert-worker-1": (GPU1, {nv: 1}, "Succeeded", "bert"),
    }
    assert set(pods) == set(want_pods)
    for name, (node, gpus, phase, top) in want_pods.items():
        r = pods[name]
        assert (
            r["uid"],
            r["namespace"],
            r["node"],
            r["gpu_resources"],
            r["gpus"],
            r["phase"],
            r["workload_uid"],
            r["running"],
            r["deleted"],
        ) == (f"uid-{name}", NS, node, gpus, sum(gpus.values()), phase, U[top], False, True), name
        assert None not in (r["created_at"], r["started_at"], r["ended_at"], r["deleted_at"])

    # -- workload_pod_references: every level of the chain --------------------------------
    refs = {(r["workload_uid"], r["pod_uid"]) for r in rows(db_url, "workload_pod_references")}
    chains = {
        "trainer-5d9f": ("trainer-5d9f", "trainer"),
        "nightly-29000": ("nightly-29000", "nightly"),
        "bert": ("bert",),
    }
    want_refs = {
        (U[w], f"uid-{p}")
        for p in want_pods
        for w in chains[next(c for c in chains if p.startswith(c))]
    }
    assert refs == want_refs and len(rows(db_url, "workload_pod_references")) == 11

    # -- gpu_pods_events: derived from consecutive snapshots ------------------------------
    def ev(*e: str) -> tuple[str, ...]:
        return e

    start = [
        ev("created", "", "", "Pending"),
        ev("phase", "", "Pending", "Running"),
        ev("condition", "Ready", "", "True"),
    ]
    finish = [ev("phase", "", "Running", "Succeeded"), ev("condition", "Ready", "True", "False")]
    want_events = {
        "trainer-5d9f-a": start
        + [
            ev("condition", "Ready", "True", "False"),
            ev("restart", "main", "0", "1"),
            ev("condition", "Ready", "False", "True"),
            ev("deleted", "", "Running", ""),
        ],
        "trainer-5d9f-b": start + [ev("deleted", "", "Running", "")],
        "nightly-29000-x": start
        + [
            ev("phase", "", "Running", "Failed"),
            ev("condition", "Ready", "True", "False"),
            ev("deleted", "", "Failed", ""),
        ],
        "nightly-29000-y": start + finish + [ev("deleted", "", "Succeeded", "")],
        "bert-master-0": start + finish + [ev("deleted", "", "Succeeded", "")],
        "bert-worker-0": start + finish + [ev("deleted", "", "Succeeded", "")],
        "bert-worker-1": start
        + [ev("restart", "main", "0", "1")]
        + finish
        + [ev("deleted", "", "Succeeded", "")],
    }
    events = rows(db_url, "gpu_pods_events")
    for name, want_list in want_events.items():
        got_list = [
            (e["type"], e["subject"], e["old_value"], e["new_value"])
            for e in events
            if e["pod_uid"] == f"uid-{name}"
        ]
        # a restart and its condition change in one snapshot are ordered by type
        assert sorted(got_list) == sorted(want_list), name
    assert len(events) == sum(len(v) for v in want_events.values()) == 42

    # -- pod_snapshots: one per state that mattered, secrets gone -------------------------
    snaps = Counter(r["pod_uid"] for r in rows(db_url, "pod_snapshots"))
    assert snaps == {
        "uid-trainer-5d9f-a": 4,
        "uid-trainer-5d9f-b": 2,
        "uid-nightly-29000-x": 3,
        "uid-nightly-29000-y": 3,
        "uid-bert-master-0": 3,
        "uid-bert-worker-0": 3,
        "uid-bert-worker-1": 4,
    }
    text = json.dumps(
        [
            {k: r[k] for k in ("pod_metadata", "spec", "status")}
            for r in rows(db_url, "pod_snapshots")
        ]
    )
    assert "s3cret" not in text and "secretKeyRef" not in text and "HF_TOKEN" in text

    # -- pod_resources: the spec's GPUs, with the node's GPU model ------------------------
    res = {
        (r["pod_uid"], r["container"], r["source"], r["resource"], r["count"], r["model"])
        for r in rows(db_url, "pod_resources")
    }
    assert res == {
        (
            f"uid-{n}",
            "main",
            "spec",
            next(iter(g)),
            sum(g.values()),
            H100 if node == GPU1 else MI300,
        )
        for n, (node, g, _, _) in want_pods.items()
    }

    # the recorder let go of everything: no watchers, no finalizers left anywhere
    eventually(lambda: not app.tracker.workloads and not app.tracker.kinds, timeout=5)
    for coll in ("deployments", "replicasets", "jobs", "cronjobs", "pytorchjobs"):
        assert not api.objects[coll], coll
