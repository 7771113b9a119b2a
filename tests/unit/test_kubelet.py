"""The kubelet collector against an HTTPS stand-in with a test CA: allocation rate and
ephemeral storage equal hand-computed values; a wrong CA fails closed and says why."""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.core import Metric

from lens_ebpf.agent.pods.kubelet import KubeletClient, KubeletCollector, gpu_allocation
from lens_ebpf.core.collector import CollectorError
from lens_ebpf.k8s.objects import ObjectError
from lens_ebpf.k8s.resources import effective_request
from tests.grpclab import make_certs

FIX = Path(__file__).parent.parent / "fixtures" / "kubelet"
TOKEN = "kubelet-test-token"
RESOURCES = ["amd.com/gpu", "nvidia.com/gpu"]


class Kubelet:
    """HTTPS on 127.0.0.1 serving the fixture answers to a bearer token."""

    def __init__(self, certs: dict[str, Path]) -> None:
        self.answers: dict[str, bytes] = {
            "/pods": (FIX / "pods.json").read_bytes(),
            "/stats/summary": (FIX / "stats_summary.json").read_bytes(),
        }
        kubelet = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self.send_response(401)
                    self.end_headers()
                    return
                body = kubelet.answers.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(certs["server.crt"], certs["server.key"])
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_certs(tmp_path_factory.mktemp("kubelet-certs"))


@pytest.fixture
def kubelet(certs: dict[str, Path]) -> Iterator[Kubelet]:
    k = Kubelet(certs)
    yield k
    k.httpd.shutdown()


@pytest.fixture
def token(tmp_path: Path) -> str:
    (tmp_path / "token").write_text(TOKEN + "\n")
    return str(tmp_path / "token")


def samples(fams: list[Metric]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in fams for s in m.samples}


def test_allocation_and_storage_equal_hand_computed(
    kubelet: Kubelet, certs: dict[str, Path], token: str
) -> None:
    client = KubeletClient(kubelet.url, str(certs["ca.crt"]), token, False, 5)
    c = KubeletCollector(15, client, "gpu-node-1", RESOURCES, lambda: 16)
    c.run_once()
    assert c.success, c.last_error
    got = samples(c.snapshot())
    # train-0: max(init 5, app 2 + 1 (limits only)) = 5
    # serve: sidecar 1 then init 2 -> init peak 3; app 4 + sidecar 1 = 5 -> 5
    # cuda-check: 1 nvidia.com/gpu; the Succeeded and the Pending pod do not count
    assert got[("lens_k8s_gpu_requested", (("resource", "amd.com/gpu"),))] == 10
    assert got[("lens_k8s_gpu_requested", (("resource", "nvidia.com/gpu"),))] == 1
    assert got[("node_k8s_gpu_allocation_rate", ())] == 11 / 16 * 100  # 68.75
    node = (("node", "gpu-node-1"),)
    assert got[("node_ephemeral_storage_usage_bytes", node)] == 131627421696
    assert got[("node_ephemeral_storage_available_bytes", node)] == 371293638656
    assert got[("node_ephemeral_storage_capacity_bytes", node)] == 502921060352
    assert got[("node_ephemeral_storage_usage_percent", node)] == pytest.approx(
        131627421696 / 502921060352 * 100
    )
    pod = "pod_ephemeral_storage_usage_bytes"
    assert got[(pod, (("namespace", "ml"), ("node", "gpu-node-1"), ("pod", "train-0")))] == (
        21474885632
    )
    assert (
        got[(pod, (("namespace", "ml"), ("node", "gpu-node-1"), ("pod", "serve-6f7b9-x2k4q")))]
        == 45056
    )
    assert sum(1 for name, _ in got if name == pod) == 2  # kube-proxy reports none
    # each pod's PersistentVolumeClaims, as the summary measures them (the projected
    # service account token is no claim: none for it, as kubelet_volume_stats_* has none)
    data = (
        ("namespace", "ml"),
        ("node", "gpu-node-1"),
        ("persistentvolumeclaim", "train-data"),
        ("pod", "train-0"),
        ("volume", "data"),
    )
    models = (
        ("namespace", "ml"),
        ("node", "gpu-node-1"),
        ("persistentvolumeclaim", "model-cache"),
        ("pod", "serve-6f7b9-x2k4q"),
        ("volume", "models"),
    )
    assert {(n, lb): v for (n, lb), v in got.items() if n.startswith("lens_pod_volume_")} == {
        ("lens_pod_volume_used_bytes", data): 133143986176,
        ("lens_pod_volume_capacity_bytes", data): 1099511627776,
        ("lens_pod_volume_available_bytes", data): 966367641600,
        ("lens_pod_volume_inodes_used", data): 864,
        ("lens_pod_volume_used_bytes", models): 53687091200,
        ("lens_pod_volume_capacity_bytes", models): 107374182400,
        ("lens_pod_volume_available_bytes", models): 53687091200,
        ("lens_pod_volume_inodes_used", models): 800,
    }


def test_wrong_ca_fails_closed_and_says_why(kubelet: Kubelet, tmp_path: Path, token: str) -> None:
    other = make_certs(tmp_path)  # a CA that did not sign the kubelet's certificate
    client = KubeletClient(kubelet.url, str(other["ca.crt"]), token, False, 5)
    with pytest.raises(CollectorError) as err:
        client.get("/pods")
    assert err.value.reason == "tls"
    assert "TLS verification failed" in str(err.value) and str(other["ca.crt"]) in str(err.value)
    c = KubeletCollector(15, client, "gpu-node-1", RESOURCES, lambda: 16)
    c.run_once()
    assert not c.success and c.snapshot() == [] and c.errors == {"tls": 1}
    # the explicit insecure flag is the only way past a certificate that does not verify
    insecure = KubeletClient(kubelet.url, str(other["ca.crt"]), token, True, 5)
    assert len(insecure.get("/pods")["items"]) == 6


def test_token_and_reachability_errors(
    kubelet: Kubelet, certs: dict[str, Path], tmp_path: Path
) -> None:
    client = KubeletClient(kubelet.url, str(certs["ca.crt"]), str(tmp_path / "none"), False, 5)
    with pytest.raises(CollectorError, match="HTTP 401 unauthorized"):
        client.get("/pods")
    dead = KubeletClient("https://127.0.0.1:9", str(certs["ca.crt"]), "", False, 1)
    with pytest.raises(CollectorError) as err:
        dead.get("/pods")
    assert err.value.reason == "connect"
    missing_ca = KubeletClient(kubelet.url, str(tmp_path / "no-ca.crt"), "", False, 1)
    with pytest.raises(CollectorError, match="cannot load"):
        missing_ca.get("/pods")


def test_one_endpoint_failing_keeps_the_other(
    kubelet: Kubelet, certs: dict[str, Path], token: str
) -> None:
    kubelet.answers["/stats/summary"] = b"<html>oops</html>"
    client = KubeletClient(kubelet.url, str(certs["ca.crt"]), token, False, 5)
    c = KubeletCollector(15, client, "gpu-node-1", RESOURCES, lambda: 0)
    c.run_once()
    got = samples(c.snapshot())
    assert c.errors == {"parse": 1}
    assert got[("lens_k8s_gpu_requested", (("resource", "amd.com/gpu"),))] == 10
    # no GPUs on the node: no rate at all rather than a division by zero or a 0
    assert not any(name == "node_k8s_gpu_allocation_rate" for name, _ in got)


def test_effective_request_rule_and_bad_pods() -> None:
    def ctr(n: int | str | None, restart: str | None = None) -> dict[str, Any]:
        c: dict[str, Any] = {"name": "c", "resources": {}}
        if n is not None:
            c["resources"] = {"requests": {"amd.com/gpu": str(n)}}
        if restart:
            c["restartPolicy"] = restart
        return c

    def pod(
        containers: list, init: list | None = None, uid: str = "u", phase: str = "Running"
    ) -> dict[str, Any]:
        return {
            "metadata": {"name": uid, "uid": uid},
            "status": {"phase": phase},
            "spec": {"containers": containers, "initContainers": init or []},
        }

    assert effective_request(pod([ctr(1), ctr(1)]), "amd.com/gpu") == 2
    assert effective_request(pod([ctr(1)], [ctr(4)]), "amd.com/gpu") == 4
    assert (
        effective_request(pod([ctr(2)], [ctr(1, "Always"), ctr(1, "Always")]), "amd.com/gpu") == 4
    )
    assert effective_request(pod([ctr(None)]), "amd.com/gpu") == 0
    dup = pod([ctr(2)], uid="same")
    alloc = gpu_allocation(
        {"items": [dup, dup, pod([ctr("1.5")], uid="bad"), "junk"]}, ["amd.com/gpu"]
    )
    assert alloc.requested == {"amd.com/gpu": 2} and alloc.pods == 1 and alloc.bad_pods == 2
    with pytest.raises(ObjectError):
        gpu_allocation({"kind": "Status"}, ["amd.com/gpu"])
    assert json.loads((FIX / "pods.json").read_text())["kind"] == "PodList"
