"""Metric alert rules written where the Prometheus Operator reads them, against a real
kube-apiserver (1.20.2, RBAC on) as the recorder's ServiceAccount with deploy/recorder's
RBAC as shipped: without the PrometheusRule CRD a sync says so and writes the rules file;
with it (a CRD of the operator's group and kind, its schema open) each enabled rule is a
PrometheusRule in the service's namespace, labelled for the operator's ruleSelector, its
groups the rule's; a disabled or deleted rule's object goes; a shipped rule is not
written (deploy/prometheus-operator/prometheusrule.yaml ships it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from lens_ebpf.k8s.client import api_client
from lens_ebpf.recorder.alerts import rules
from lens_ebpf.recorder.alerts.rules import MetricRules
from lens_ebpf.recorder.store.writer import engine_for, upgrade
from tests.kube.apiserver import KubeApiServer, unavailable
from tests.kube.recorders import NAMESPACE, apply

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
T0 = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
LABELS = {"release": "kube-prometheus-stack"}  # a ruleSelector's
# the operator's CRD as far as the API server needs it: its group, kind and names, the
# schema left open (the operator's own validates the rules)
CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "prometheusrules.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {
            "plural": "prometheusrules",
            "singular": "prometheusrule",
            "kind": "PrometheusRule",
            "listKind": "PrometheusRuleList",
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
RULE = {
    "name": "GPU hot",
    "cluster_name": "lab",
    "enabled": True,
    "groups": [
        {
            "name": "gpu",
            "interval": "30s",
            "rules": [
                {
                    "alert": "GPUHot",
                    "expr": "DCGM_FI_DEV_GPU_TEMP > 90",
                    "for": "5m",
                    "labels": {"severity": "critical"},
                    "annotations": {"summary": "hot"},
                }
            ],
        }
    ],
}


@pytest.fixture(scope="module")
def lab() -> Iterator[KubeApiServer]:
    why = unavailable()
    if why:
        pytest.skip(why)
    with KubeApiServer() as server:
        apply(
            server,
            DEPLOY / "namespace.yaml",
            *(DEPLOY / "recorder" / f for f in ("serviceaccount.yaml", "rbac.yaml")),
        )
        yield server


def objects(lab: KubeApiServer) -> dict[str, Any]:
    out = lab.kubectl("get", "prometheusrules", "-n", NAMESPACE, "-o", "json").stdout
    return {x["metadata"]["name"]: x for x in json.loads(out)["items"]}


def test_rules_become_prometheusrules_as_the_recorders_account(
    lab: KubeApiServer, tmp_path: Path
) -> None:
    client = api_client(
        "kubeconfig",
        str(lab.kubeconfig_for(NAMESPACE, "lens-ebpf-recorder", tmp_path / "kubeconfig")),
    )
    eng = engine_for(f"sqlite:///{tmp_path / 'r.db'}")
    upgrade(eng)
    mr = MetricRules(client, NAMESPACE, LABELS, str(tmp_path / "rules.yml"), "lab")
    with eng.begin() as conn:
        assert rules.seed(conn, T0, "lab") == 2  # rules.SHIPPED's groups
        rid = mr.create(conn, RULE, T0, "test")["rule_id"]
        got = mr.sync(conn, [], "lab", T0)
    assert (got["total"], got["synced"]) == (1, 1) and "no PrometheusRule CRD" in got["message"]
    assert "GPUHot" in (tmp_path / "rules.yml").read_text()

    lab.kubectl("apply", "-f", "-", input=json.dumps(CRD))
    lab.kubectl(
        "wait",
        "--for=condition=established",
        "--timeout=30s",
        "crd/prometheusrules.monitoring.coreos.com",
    )
    with eng.begin() as conn:
        got = mr.sync(conn, [], "lab", T0)
        row = mr.get(conn, rid)
    assert (got["total"], got["synced"], got["failed"]) == (1, 1, 0), got
    name = f"lens-gpu-hot-{rid}"
    assert (row.sync_status, row.sync_message) == ("synced", f"PrometheusRule {NAMESPACE}/{name}")
    obj = objects(lab)[name]
    assert obj["metadata"]["labels"] == {
        **LABELS,
        "app.kubernetes.io/managed-by": "lens-ebpf",
        "lens-ebpf.io/rule-id": str(rid),
    }
    assert obj["spec"]["groups"] == RULE["groups"]
    # changed: the object follows (an update, its resourceVersion read first)
    with eng.begin() as conn:
        mr.update(conn, rid, {"groups": [{**RULE["groups"][0], "interval": "1m"}]}, T0)
        mr.sync(conn, [rid], "", T0)
    assert objects(lab)[name]["spec"]["groups"][0]["interval"] == "1m"
    # disabled: its object goes; deleted (enabled again first): gone as well
    with eng.begin() as conn:
        mr.update(conn, rid, {"enabled": False}, T0)
        assert mr.sync(conn, [rid], "", T0)["synced"] == 1
    assert objects(lab) == {}
    with eng.begin() as conn:
        mr.update(conn, rid, {"enabled": True}, T0)
        mr.sync(conn, [rid], "", T0)
        assert list(objects(lab)) == [name]
        assert mr.delete(conn, rid)["warning"] == ""
    assert objects(lab) == {}
    eng.dispose()
