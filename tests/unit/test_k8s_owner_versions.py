"""An owner read at the API version the cluster serves it at: CronJob is batch/v1 from
Kubernetes 1.21 and batch/v1beta1 only on 1.20 and before (batch/v1 answers 404 there, as
tests/kube/test_agent_rbac.py found on a real 1.20.2), so the agent asks batch/v1 first, then
batch/v1beta1, and keeps asking the one that answered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lens_ebpf.agent.config import KubernetesConfig
from lens_ebpf.agent.pods.cluster import ClusterWatch, FirstServed
from lens_ebpf.k8s.client import api_client
from tests import k8slab
from tests.k8slab import FakeApiServer, owned, pod

ASKED_V1 = [
    "/apis/batch/v1/namespaces/batch/cronjobs/hourly",
    "/apis/batch/v1/namespaces/batch/cronjobs/nightly",
]
ASKED_V1BETA1 = [
    "/apis/batch/v1/namespaces/batch/cronjobs/hourly",  # 404: not served
    "/apis/batch/v1beta1/namespaces/batch/cronjobs/hourly",
    "/apis/batch/v1beta1/namespaces/batch/cronjobs/nightly",
]


@pytest.mark.parametrize(
    ("served_at", "asked"), [("batch/v1", ASKED_V1), ("batch/v1beta1", ASKED_V1BETA1)]
)
def test_a_cronjob_is_read_where_the_cluster_serves_it(
    served_at: str, asked: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the stand-in serves CronJob at one version only, as a 1.20 (or a 1.25+) server does
    monkeypatch.setitem(k8slab.KINDS, "cronjobs", (f"/apis/{served_at}", "CronJob", True))
    api = FakeApiServer().start()
    k = KubernetesConfig(backoff_max_seconds=0.5, request_timeout_seconds=2)
    w = ClusterWatch(api_client("kubeconfig", str(api.kubeconfig(tmp_path / "kc"))), k)
    try:
        for cron in ("nightly", "hourly"):
            api.put("cronjobs", owned("CronJob", cron, "batch"))
            api.put("jobs", owned("Job", f"{cron}-1", "batch", owner=("CronJob", cron)))
        api.put("pods", pod("nightly-1-a", "10.244.2.7", "batch", owner=("Job", "nightly-1")))
        api.put("pods", pod("hourly-1-a", "10.244.2.8", "batch", owner=("Job", "hourly-1")))
        w.start()
        assert w.wait_synced(5)
        got = [w.index.lookup(ip) for ip in ("10.244.2.7", "10.244.2.8")]
        assert [(i.workload_kind, i.workload) for i in got if i] == [
            ("CronJob", "nightly"),
            ("CronJob", "hourly"),
        ]
        assert w.owners.lookups == {"hit": 0, "fetched": 4, "error": 0}
        assert [r for r in api.requests if "/cronjobs/" in r] == asked
    finally:
        w.stop()
        api.kill()


class ApiStatusError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"({status})")
        self.status = status


def test_only_a_404_asks_the_next_version() -> None:
    asked: list[str] = []

    def getter(version: str, status: int = 0) -> Any:
        def get(namespace: str, name: str) -> dict[str, Any]:
            asked.append(version)
            if status:
                raise ApiStatusError(status)
            return {"metadata": {"name": name, "namespace": namespace}}

        return get

    # refused (403) or failing (500): said as it is, not hidden behind another version
    for status in (403, 500):
        with pytest.raises(ApiStatusError) as err:
            FirstServed(getter("v1", status), getter("v1beta1"))("ns", "c")
        assert err.value.status == status
    assert asked == ["v1", "v1"]
    # missing at both: the last 404
    asked.clear()
    with pytest.raises(ApiStatusError) as err:
        FirstServed(getter("v1", 404), getter("v1beta1", 404))("ns", "c")
    assert (err.value.status, asked) == (404, ["v1", "v1beta1"])
