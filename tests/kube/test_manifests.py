"""Installed as users install it: deploy/'s kustomizations and the Helm chart charts/lens-ebpf.

- every kustomization builds with kustomize 5 (kubectl 1.32's, /usr/bin/kubectl) and with
  kubectl 1.20's kustomize (v2.0.3, the lab's cached kubectl), both to the same objects;
- the chart, rendered and linted by Helm's own library (helm-python-sdk: Helm v4's Go SDK
  in its wheel, offline, no helm binary), renders for each form (the agent, without
  privileged, the recorder replicated and single, on 1.20 and on current clusters, the
  Prometheus Operator's objects, the recorder's opt-in NetworkPolicy with and without the
  nodes' CIDRs) exactly the objects kustomize builds for that form: same kinds, names,
  namespaces and content, labels included;
- the files the chart carries from deploy/ (files/deploy/...) are byte copies;
- on a real kube-apiserver 1.20.2 (tests/kube/apiserver.py), `kubectl apply -k` of each
  overlay that serves 1.20 and `kubectl apply -f` of the chart rendered with 1.20's
  capabilities are accepted and the objects exist; deploy/recorder (policy/v1) is refused
  there, which is why deploy/kube-1.20 exists."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import hang_guard
from tests.kube import build
from tests.kube.apiserver import KubeApiServer, KubectlError, unavailable

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = ROOT / "charts" / "lens-ebpf"
NS = "lens-ebpf"  # deploy/'s namespace; the chart's objects follow the release's
KUBE_1_20 = "v1.20.2"  # the oldest Kubernetes supported, the lab's
KUBE_CURRENT = "v1.32.0"
OPERATOR_API = "monitoring.coreos.com/v1"
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}
POD_OWNERS = {"DaemonSet", "Deployment"}

Key = tuple[str, str | None, str]  # kind, namespace, name


def chart_values(
    agent: dict[str, Any] | None = None,
    recorder: dict[str, Any] | None = None,
    dashboard: bool = False,
    operator: bool = False,
) -> dict[str, Any]:
    """Values that render one form: each part off unless given."""
    return {
        "agent": {"enabled": False} if agent is None else {"enabled": True, **agent},
        "recorder": {"enabled": False} if recorder is None else {"enabled": True, **recorder},
        "grafanaDashboard": {"enabled": dashboard},
        "prometheusOperator": {"enabled": operator},
    }


# overlay -> (the chart's values for the same objects, the Kubernetes version it is for)
FORMS: dict[str, tuple[dict[str, Any], str]] = {
    "deploy": (chart_values(agent={}, dashboard=True), KUBE_CURRENT),
    "deploy/minimal-capabilities": (
        chart_values(agent={"privileged": False}, dashboard=True),
        KUBE_CURRENT,
    ),
    "deploy/recorder": (chart_values(recorder={"mode": "replicated"}), KUBE_CURRENT),
    "deploy/recorder-single": (chart_values(recorder={"mode": "single"}), KUBE_CURRENT),
    "deploy/kube-1.20/recorder": (chart_values(recorder={"mode": "replicated"}), KUBE_1_20),
    "deploy/kube-1.20/recorder-single": (chart_values(recorder={"mode": "single"}), KUBE_1_20),
    "deploy/prometheus-operator": (chart_values(operator=True), KUBE_CURRENT),
    "deploy/network-policy": (
        chart_values(recorder={"mode": "single", "networkPolicy": {"enabled": True}}),
        KUBE_CURRENT,
    ),
}
# an overlay applied beside another: the chart's values for it render both
BESIDE = {"deploy/network-policy": "deploy/recorder-single"}
NO_PODS = {"deploy/prometheus-operator", "deploy/network-policy"}
# what Kubernetes 1.20 takes: everything but the policy/v1 PodDisruptionBudgets
ON_1_20 = [o for o, (_, kube) in FORMS.items() if kube == KUBE_1_20 or "recorder" not in o]


def key(doc: dict[str, Any]) -> Key:
    return doc["kind"], doc["metadata"].get("namespace"), doc["metadata"]["name"]


def by_key(docs: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    out = {key(d): d for d in docs}
    assert len(out) == len(docs), "two objects of the same kind, namespace and name"
    return out


# -- kustomize ----------------------------------------------------------------------------
def kubectl_current() -> str:
    """A kubectl whose kustomize is 5 (/usr/bin/kubectl here, 1.32); skip without one."""
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip("no kubectl on PATH (kubectl 1.32, kustomize 5, builds the overlays)")
    got = subprocess.run(
        [path, "version", "--client", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=hang_guard(30),
    )
    version = json.loads(got.stdout or "{}").get("kustomizeVersion", "")
    if not version.startswith("v5."):
        pytest.skip(f"{path} has kustomize {version or '?'}, not 5")
    return path


def kubectl_1_20() -> str:
    if not build.KUBECTL.is_file():
        pytest.skip(f"kubectl 1.20.2 is not in {build.CACHE} (python -m tests.kube.build)")
    return str(build.KUBECTL)


def kustomize(kubectl: str, overlay: str) -> list[dict[str, Any]]:
    got = subprocess.run(
        [kubectl, "kustomize", str(ROOT / overlay)],
        capture_output=True,
        text=True,
        timeout=hang_guard(30),
    )
    assert got.returncode == 0, f"{kubectl} kustomize {overlay}: {got.stderr}"
    return [d for d in yaml.safe_load_all(got.stdout) if d]


@pytest.fixture(scope="module")
def built() -> dict[str, list[dict[str, Any]]]:
    """Every overlay as kustomize 5 builds it."""
    kubectl = kubectl_current()
    return {overlay: kustomize(kubectl, overlay) for overlay in FORMS}


def pod_specs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d["spec"]["template"]["spec"] for d in docs if d["kind"] in POD_OWNERS]


@pytest.mark.parametrize("overlay", list(FORMS))
def test_every_overlay_builds_with_kustomize_5(
    overlay: str, built: dict[str, list[dict[str, Any]]]
) -> None:
    docs = built[overlay]
    kinds = {d["kind"] for d in docs}
    # the Prometheus Operator's kinds only where asked for: deploy/ applies to a plain cluster
    assert bool(kinds & CRD_KINDS) == (overlay == "deploy/prometheus-operator"), kinds
    # the recorder's NetworkPolicy is opt in (most plugins see the agents as their nodes)
    assert ("NetworkPolicy" in kinds) == (overlay == "deploy/network-policy"), kinds
    assert all(s["enableServiceLinks"] is False for s in pod_specs(docs))
    assert len(pod_specs(docs)) == (0 if overlay in NO_PODS else 1)
    pdbs = [d["apiVersion"] for d in docs if d["kind"] == "PodDisruptionBudget"]
    if "recorder" in overlay:
        assert pdbs == ["policy/v1beta1" if "kube-1.20" in overlay else "policy/v1"]


@pytest.mark.parametrize("overlay", list(FORMS))
def test_kubectl_1_20s_kustomize_builds_the_same_objects(
    overlay: str, built: dict[str, list[dict[str, Any]]]
) -> None:
    """kustomize v2.0.3 (no per-generator options, no directories in resources, no inline
    patches): each overlay builds, to what kustomize 5 builds."""
    old = by_key(kustomize(kubectl_1_20(), overlay))
    assert old == by_key(built[overlay])


# -- the chart ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    helm = pytest.importorskip(
        "helm_python", reason="helm-python-sdk is not installed (pip install -e .[dev])"
    )
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render(
    chart: Any,
    values: dict[str, Any],
    namespace: str = NS,
    kube_version: str | None = None,
    api_versions: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """The chart's objects as `helm template --kube-version --api-versions` renders them.
    Chart.render() takes no capabilities; the library's render call does (the options
    kube_version and api_versions), hence the call one level down (the version is pinned
    in pyproject.toml)."""
    from helm_python import _native

    opts: dict[str, Any] = {"name": "lens-ebpf", "namespace": namespace}
    if kube_version:
        opts["kube_version"] = kube_version
    if api_versions:
        opts["api_versions"] = list(api_versions)
    out = json.loads(
        _native.call_string("helm_render", chart._raw(), json.dumps(values), json.dumps(opts))
    )
    return [
        d
        for name, text in sorted(out.items())
        if not name.endswith("/NOTES.txt")
        for d in yaml.safe_load_all(text)
        if d
    ]


@pytest.mark.parametrize("overlay", list(FORMS))
def test_the_chart_renders_what_kustomize_builds(
    overlay: str, built: dict[str, list[dict[str, Any]]], chart: Any
) -> None:
    """Same objects, same content, for the Kubernetes version the overlay is for. The one
    difference: kustomize's agent creates the Namespace, the chart installs into the
    release's (helm install -n lens-ebpf --create-namespace)."""
    values, kube = FORMS[overlay]
    ours = by_key(render(chart, values, kube_version=kube))
    theirs = by_key(built[overlay] + (built[BESIDE[overlay]] if overlay in BESIDE else []))
    namespaces = {k for k in theirs if k[0] == "Namespace"}
    assert namespaces == (
        {("Namespace", None, NS)} if overlay in ("deploy", "deploy/minimal-capabilities") else set()
    )
    for k in namespaces:
        del theirs[k]
    assert sorted(ours) == sorted(theirs)
    for k, doc in theirs.items():
        assert ours[k] == doc, k


def with_nodes(tmp_path: Path, cidrs: list[str]) -> Path:
    """deploy/network-policy as its kustomization says to open it to the nodes: cidrs in
    nodes.yaml (one `add` each, as the shipped one), the patchesJson6902 uncommented."""
    out = tmp_path / "network-policy"
    shutil.copytree(DEPLOY / "network-policy", out)
    (shipped,) = yaml.safe_load((out / "nodes.yaml").read_text())
    ops = [{**shipped, "value": {"ipBlock": {"cidr": c}}} for c in cidrs]
    (out / "nodes.yaml").write_text(yaml.safe_dump(ops))
    kust = out / "kustomization.yaml"
    head, mark, tail = kust.read_text().partition("# patchesJson6902:")
    assert mark, f"{kust}: no commented patchesJson6902"
    kust.write_text(head + re.sub(r"(?m)^# ?", "", mark + tail))
    return out


@pytest.mark.parametrize("cidrs", [["10.0.0.0/16"], ["10.0.0.0/16", "192.168.10.0/24"]])
def test_the_chart_s_node_cidrs_are_the_overlay_s_documented_patch(
    chart: Any, tmp_path: Path, cidrs: list[str]
) -> None:
    """recorder.networkPolicy.nodeCIDRs: the collector port's rule lets the agents' pods
    and those addresses in, as deploy/network-policy with nodes.yaml's patch does (built
    alike by both kustomizes)."""
    overlay = str(with_nodes(tmp_path, cidrs))
    theirs = by_key(kustomize(kubectl_current(), overlay))
    assert by_key(kustomize(kubectl_1_20(), overlay)) == theirs
    values = chart_values(
        recorder={"mode": "single", "networkPolicy": {"enabled": True, "nodeCIDRs": cidrs}}
    )
    ours = {k: d for k, d in by_key(render(chart, values)).items() if k[0] == "NetworkPolicy"}
    assert ours == theirs
    (policy,) = theirs.values()
    assert policy["spec"]["ingress"][1]["from"][1:] == [{"ipBlock": {"cidr": c}} for c in cidrs]


def test_default_values_are_the_agent_and_the_single_recorder(
    built: dict[str, list[dict[str, Any]]], chart: Any
) -> None:
    """helm install with no values: deploy/ and deploy/recorder-single together; offline
    (no cluster to ask) no operator objects and the PodDisruptionBudget as policy/v1."""
    both = by_key(built["deploy"] + built["deploy/recorder-single"])
    del both[("Namespace", None, NS)]
    assert by_key(render(chart, {})) == both


@pytest.mark.parametrize(
    ("kube", "apis", "pdb", "operator"),
    [
        (KUBE_1_20, (), "policy/v1beta1", False),
        (KUBE_1_20, (OPERATOR_API,), "policy/v1beta1", True),
        # discovery listing policy/v1's PodDisruptionBudget wins over the version
        (KUBE_1_20, ("policy/v1/PodDisruptionBudget",), "policy/v1", False),
        (KUBE_CURRENT, (), "policy/v1", False),
        (KUBE_CURRENT, (OPERATOR_API,), "policy/v1", True),
    ],
)
def test_the_cluster_s_capabilities_choose_the_pdb_and_the_operator_objects(
    chart: Any, kube: str, apis: tuple[str, ...], pdb: str, operator: bool
) -> None:
    """prometheusOperator.enabled: auto (the default) renders them where the cluster serves
    monitoring.coreos.com/v1; true and false whatever it serves."""
    docs = render(chart, {"recorder": {"mode": "replicated"}}, kube_version=kube, api_versions=apis)
    assert [d["apiVersion"] for d in docs if d["kind"] == "PodDisruptionBudget"] == [pdb]
    assert {d["kind"] for d in docs} & CRD_KINDS == (CRD_KINDS if operator else set())
    for forced in (True, False):
        docs = render(
            chart, {"prometheusOperator": {"enabled": forced}}, kube_version=kube, api_versions=apis
        )
        assert {d["kind"] for d in docs} & CRD_KINDS == (CRD_KINDS if forced else set())


LINTED = {"defaults": {}, **{overlay: values for overlay, (values, _) in FORMS.items()}}


@pytest.mark.parametrize("kube", [KUBE_1_20, KUBE_CURRENT])
@pytest.mark.parametrize("form", list(LINTED))
def test_helm_lint_is_clean(form: str, kube: str) -> None:
    """Helm's lint, strict, on each form's values: no error, no warning (its one finding
    is "icon is recommended", an info)."""
    helm = pytest.importorskip("helm_python", reason="helm-python-sdk is not installed")
    got = helm.lint(CHART, LINTED[form], strict=True, namespace=NS, kube_version=kube)
    assert got["errors"] == [] and got["total_charts_linted"] == 1
    assert [m for m in got["messages"] if m["severity"] >= 2] == [], got["messages"]


def test_the_chart_follows_its_release_namespace(chart: Any) -> None:
    """Installed elsewhere, every namespaced object and every reference to the namespace
    follow, but the kube-system Roles the agent and the recorder need."""
    values = {
        "recorder": {"mode": "replicated", "networkPolicy": {"enabled": True}},
        "prometheusOperator": {"enabled": True},
    }
    docs = render(chart, values, namespace="gpu-watch")
    assert "NetworkPolicy" in {d["kind"] for d in docs}
    spaces = {d["metadata"].get("namespace") for d in docs}
    assert spaces == {"gpu-watch", "kube-system", None}
    in_kube_system = {d["kind"] for d in docs if d["metadata"].get("namespace") == "kube-system"}
    assert in_kube_system == {"Role", "RoleBinding"}
    subjects = {s["namespace"] for d in docs for s in d.get("subjects", [])}
    assert subjects == {"gpu-watch"}
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    env = {
        e["name"]: e.get("value") for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["LENS_REPORTER__TARGET"] == "lens-ebpf-recorder.gpu-watch:9472"
    assert f"namespace: {NS}" not in yaml.safe_dump_all(docs)


def test_the_values_users_change_reach_the_objects(chart: Any) -> None:
    values = {
        "agent": {
            "image": {
                "repository": "registry.example/lens-ebpf",
                "tag": "0.2.0",
                "pullPolicy": "Always",
            },
            "imagePullSecrets": [{"name": "regcred"}],
            "reporterTarget": "",
            "devicesCompat": ["dcgm"],
            "tuner": True,
            "extraEnv": [{"name": "LENS_CACHE__MAX_SERIES", "value": "500000"}],
            "policy": "k8sPod: [10.244.0.0/16]\n",
            "resources": {"requests": {"cpu": "50m"}},
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "nodeSelector": {"gpu": "true"},
        },
        "recorder": {
            "mode": "single",
            "image": {"repository": "registry.example/lens-ebpf-recorder"},
            "persistence": {"size": "20Gi", "storageClassName": "fast", "keep": True},
            "config": "recorder:\n  listen: 0.0.0.0:9480\n",
            "nodeSelector": {"role": "infra"},
        },
    }
    docs = by_key(render(chart, values))
    agent = docs[("DaemonSet", NS, "lens-ebpf")]["spec"]["template"]["spec"]
    c = agent["containers"][0]
    assert (c["image"], c["imagePullPolicy"]) == ("registry.example/lens-ebpf:0.2.0", "Always")
    assert agent["imagePullSecrets"] == [{"name": "regcred"}]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["LENS_REPORTER__TARGET"] == ""
    assert json.loads(env["LENS_DEVICES__COMPAT"]) == ["dcgm"]
    assert env["LENS_COLLECTORS__TUNER__ENABLED"] == "true"
    assert env["LENS_CACHE__MAX_SERIES"] == "500000"
    # Helm merges maps into the defaults (a key set to null drops one)
    assert c["resources"] == {
        "requests": {"cpu": "50m", "memory": "200Mi"},
        "limits": {"memory": "1Gi"},
    }
    assert agent["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert agent["nodeSelector"] == {"gpu": "true"}
    policy = docs[("ConfigMap", NS, "lens-ebpf-policy")]["data"]
    assert policy == {"policy.yaml": "k8sPod: [10.244.0.0/16]\n"}
    rec = docs[("Deployment", NS, "lens-ebpf-recorder")]["spec"]["template"]["spec"]
    assert rec["containers"][0]["image"] == "registry.example/lens-ebpf-recorder:0.1.0"
    assert "imagePullPolicy" not in rec["containers"][0]  # Kubernetes' default
    assert rec["nodeSelector"] == {"role": "infra"}
    pvc = docs[("PersistentVolumeClaim", NS, "lens-ebpf-recorder")]
    assert pvc["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    spec = pvc["spec"]
    assert (spec["storageClassName"], spec["resources"]["requests"]["storage"]) == ("fast", "20Gi")
    config = docs[("ConfigMap", NS, "lens-ebpf-recorder")]["data"]
    assert config == {"recorder.yaml": "recorder:\n  listen: 0.0.0.0:9480\n"}
    # the appVersion when no tag is given
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["appVersion"] == "0.1.0" and meta["apiVersion"] == "v2"


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ({"recorder": {"mode": "sharded"}}, 'recorder.mode is "sharded": replicated or single'),
        (
            {"prometheusOperator": {"enabled": "yes"}},
            'prometheusOperator.enabled is "yes": true, false or auto',
        ),
    ],
)
def test_a_value_out_of_its_choices_fails_the_render(
    chart: Any, values: dict[str, Any], said: str
) -> None:
    from helm_python import HelmRenderError

    with pytest.raises(HelmRenderError, match=said):
        render(chart, values)


def test_the_chart_s_files_are_deploy_s() -> None:
    """The chart cannot read outside its directory (a packaged or pulled chart has only
    itself), so it carries what it takes from deploy/ under files/deploy/, at the same
    paths: each a byte copy, and each one a template reads."""
    copies = sorted(
        p.relative_to(CHART / "files" / "deploy")
        for p in (CHART / "files" / "deploy").rglob("*")
        if p.is_file()
    )
    assert [str(p) for p in copies] == [
        "agent/configmap.yaml",
        "agent/grafana-dashboard.json",
        "prometheus-operator/prometheusrule.yaml",
        "recorder/configmap.yaml",
    ]
    templates = "".join(p.read_text() for p in (CHART / "templates").rglob("*.yaml"))
    for rel in copies:
        assert (CHART / "files" / "deploy" / rel).read_bytes() == (
            DEPLOY / rel
        ).read_bytes(), f"cp deploy/{rel} charts/lens-ebpf/files/deploy/{rel}"
        assert f'"files/deploy/{rel}"' in templates, rel


# -- a real kube-apiserver 1.20.2 ---------------------------------------------------------
# the Prometheus Operator's CRDs as far as the API server needs them, the schema left open
CRDS = [
    {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {
                "plural": plural,
                "singular": kind.lower(),
                "kind": kind,
                "listKind": f"{kind}List",
            },
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }
    for plural, kind in (
        ("servicemonitors", "ServiceMonitor"),
        ("prometheusrules", "PrometheusRule"),
    )
]


@pytest.fixture
def lab() -> Iterator[KubeApiServer]:
    """A fresh API server for each install: what it holds, the install made."""
    why = unavailable()
    if why:
        pytest.skip(why)
    with KubeApiServer() as server:
        yield server


def install_crds(lab: KubeApiServer) -> None:
    lab.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": CRDS})
    )
    for crd in CRDS:
        lab.kubectl(
            "wait", "--for=condition=established", "--timeout=30s", f"crd/{crd['metadata']['name']}"
        )


def on_the_server(lab: KubeApiServer, *source: str) -> dict[Key, dict[str, Any]]:
    """The objects `source` (-k DIR or -f FILE) names, as the API server holds them."""
    got = json.loads(lab.kubectl("get", *source, "-o", "json").stdout)
    return by_key(got["items"] if got.get("kind") == "List" else [got])


def applied(lab: KubeApiServer, expected: list[dict[str, Any]], *source: str) -> None:
    """kubectl apply of `source`, accepted, and every object it holds made by the server."""
    lab.kubectl("apply", *source)
    server = on_the_server(lab, *source)
    assert sorted(server) == sorted(by_key(expected))
    for k, obj in server.items():
        assert obj["metadata"]["uid"] and obj["metadata"]["creationTimestamp"], k
    pdbs = [o for k, o in server.items() if k[0] == "PodDisruptionBudget"]
    # served as written (kubectl get -k/-f asks in the manifest's version)
    assert all(o["apiVersion"] == "policy/v1beta1" for o in pdbs)


# each install in its own API server: overlays that can stand beside each other together
INSTALLS = {
    "agent, replicated recorder, operator objects": [
        "deploy",
        "deploy/kube-1.20/recorder",
        "deploy/prometheus-operator",
    ],
    "agent without privileged, single recorder, network policy": [
        "deploy/minimal-capabilities",
        "deploy/kube-1.20/recorder-single",
        "deploy/network-policy",
    ],
}


def test_the_installs_cover_every_overlay_that_serves_1_20() -> None:
    assert sorted(o for os_ in INSTALLS.values() for o in os_) == sorted(ON_1_20)


@pytest.mark.parametrize("install", list(INSTALLS))
def test_kubectl_1_20_applies_the_overlays(lab: KubeApiServer, install: str) -> None:
    kubectl = kubectl_1_20()
    for overlay in INSTALLS[install]:
        if overlay == "deploy/prometheus-operator":
            install_crds(lab)
        applied(lab, kustomize(kubectl, overlay), "-k", str(ROOT / overlay))
    if install.startswith("agent,"):
        # current clusters' recorder is refused here: no policy/v1 before 1.21
        with pytest.raises(KubectlError, match=r"PodDisruptionBudget.*policy/v1"):
            lab.kubectl("apply", "-k", str(DEPLOY / "recorder"))


CHART_INSTALLS = {
    "defaults": {},
    "replicated, not privileged, operator objects, network policy": {
        "agent": {"privileged": False},
        "recorder": {
            "mode": "replicated",
            "networkPolicy": {"enabled": True, "nodeCIDRs": ["10.0.0.0/16"]},
        },
        "prometheusOperator": {"enabled": "auto"},
    },
}


@pytest.mark.parametrize("install", list(CHART_INSTALLS))
def test_kubectl_1_20_applies_the_chart_rendered_for_1_20(
    lab: KubeApiServer, chart: Any, install: str, tmp_path: Path
) -> None:
    """As helm install would on that cluster: its version, its API (the operator's CRDs
    where the form wants them), the release's namespace made first."""
    values = CHART_INSTALLS[install]
    apis: tuple[str, ...] = ()
    if values.get("prometheusOperator"):
        install_crds(lab)
        apis = (OPERATOR_API,)
    docs = render(chart, values, kube_version=KUBE_1_20, api_versions=apis)
    assert bool({d["kind"] for d in docs} & CRD_KINDS) == bool(apis)
    manifest = tmp_path / "lens-ebpf.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    lab.kubectl("create", "namespace", NS)
    applied(lab, docs, "-f", str(manifest))
