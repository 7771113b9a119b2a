"""lens-ebpf installed as users install it, on a real node (tests/kube/node.py): both
images built from the Dockerfile (tests/kube/images.py), `kubectl apply -k` of deploy/
through the lab's overlay (tests/kube/lab/), the kubelet starting the pods, the
controllers writing the owners' status; then what the agent and the recorder show, each
against what the kubelet, the controllers and the runtime really did."""

from __future__ import annotations

import contextlib
import json
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import flow_flood, hang_guard, wait_for
from tests.kube import images
from tests.kube import node as lab
from tests.kube.node import KubeNode, running_and_ready

pytestmark = pytest.mark.timeout(900)
OVERLAY = Path(__file__).with_name("lab")
NS = "lens-ebpf"
APP_LABEL = "app.kubernetes.io/name"
APP = "lens-node-apps"  # the workloads' namespace


@pytest.fixture(scope="module")
def node() -> Iterator[KubeNode]:
    if images.cached() is None and not images.cannot_build():
        images.build()  # what changed since scripts/setup.sh built them
    why = lab.unavailable() or images.unavailable()
    if why:
        pytest.skip(why)
    n = KubeNode().start()
    try:
        n.import_images()
        yield n
    finally:
        n.stop()


@pytest.fixture(scope="module")
def lens(node: KubeNode) -> KubeNode:
    """lens-ebpf applied with kubectl 1.20's kustomize; both pods Ready by their probes."""
    node.kubectl("apply", "-k", str(OVERLAY), timeout=120)
    node.wait_pods(NS, "app.kubernetes.io/name=lens-ebpf", running_and_ready, timeout=240)
    node.wait_pods(NS, "app.kubernetes.io/name=lens-ebpf-recorder", running_and_ready, timeout=240)
    return node


def http_get(url: str, timeout: float = 10) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


answered_how: list[str] = []  # the last unanswered request's error, for a failure's message


def answered(url: str) -> int:
    """The status of a GET, or 0 when nothing answered (refused, timed out)."""
    try:
        return http_get(url, timeout=5)[0]
    except (urllib.error.URLError, OSError) as err:
        answered_how[:] = [repr(err)]
        return 0


def samples(text: str, family: str) -> list[tuple[dict[str, str], float]]:
    """The samples of one family in exposition text, with their labels."""
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == family:
                out.append((dict(s.labels), s.value))
    return out


def apply(node: KubeNode, *objects: dict[str, Any]) -> None:
    node.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}),
    )


def test_the_node_runs_a_pod_and_a_job_to_completion(node: KubeNode) -> None:
    """The lab itself: the scheduler places, the kubelet starts, the Job controller
    completes."""
    apply(node, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": APP}})
    apply(
        node,
        job("hello", ["sh", "-c", "echo hello from the node"]),
    )

    def complete() -> bool:
        got = node.get(f"/apis/batch/v1/namespaces/{APP}/jobs/hello")
        return bool(got.get("status", {}).get("succeeded") == 1)

    wait_for(
        complete,
        lambda: "Job hello Complete: " + node._pod_story(APP, "job-name=hello"),
        timeout=120,
    )
    logs = node.kubectl("logs", "-n", APP, "job/hello").stdout
    assert logs == "hello from the node\n"


def test_lens_ebpf_comes_up_ready_from_kubectl_apply_k(lens: KubeNode) -> None:
    """Both pods Ready through their own probes, on the node's addresses."""
    [agent] = lens.pods(NS, "app.kubernetes.io/name=lens-ebpf")
    assert agent["spec"]["nodeName"] == lab.NODE_NAME
    assert agent["status"]["podIP"] == lab.NODE_IP  # hostNetwork
    status, body = http_get(f"http://{lab.NODE_IP}:9470/readyz")
    assert status == 200, body
    # through the recorder's Service: kube-proxy programs its address once the pod is
    # Ready (its endpoints), which on a busy node can come seconds after
    wait_for(
        lambda: answered(f"http://{lab.RECORDER_IP}:9480/readyz") == 200,
        lambda: f"the recorder's Service answering /readyz: {answered_how}",
        timeout=30,
    )


GPU_FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
WEB_PORT = 8080
CONNECTIONS = 7  # the client's, in its first instant


def container(name: str, command: list[str], gpus: int = 0) -> dict[str, Any]:
    """A busybox container, with `gpus` amd.com/gpu where asked."""
    got: dict[str, Any] = {"name": name, "image": images.BUSYBOX, "command": command}
    if gpus:
        got["resources"] = {"limits": {"amd.com/gpu": gpus}}
    return got


def job(name: str, command: list[str], gpus: int = 0) -> dict[str, Any]:
    """A Job of one pod that runs once (no retry)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": APP},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "enableServiceLinks": False,
                    "containers": [container(name, command, gpus)],
                }
            },
        },
    }


def deployment(name: str, command: list[str], gpus: int = 0, **pod: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": APP},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [container(name, command, gpus)],
                    **pod,
                },
            },
        },
    }


@pytest.fixture(scope="module")
def gpu_plugin(lens: KubeNode) -> Iterator[Any]:
    """The project's test device plugin (tests/kube/deviceplugin.py) registered with the
    node's kubelet: amd.com/gpu, the fixtures' two GPUs; their DRM nodes made on the host."""
    from tests.containerlab import shared_char_devices
    from tests.kube.deviceplugin import AmdGpuPlugin, sysfs_gpus

    plugin = AmdGpuPlugin(sysfs_gpus(GPU_FIX / "sys", GPU_FIX / "dev"), kfd=None)
    # shared: make test's other worker gives its containers /dev/dri/renderD128 meanwhile
    nodes = [(Path(p), major, minor) for p, major, minor in plugin.host_nodes()]
    with shared_char_devices(nodes):
        plugin.start(lab.KUBELET_ROOT)
        try:
            plugin.wait_registered(timeout=30)

            def offered() -> bool:
                got = lens.get(f"/api/v1/nodes/{lab.NODE_NAME}")["status"]
                return bool(got.get("allocatable", {}).get("amd.com/gpu") == str(len(plugin.gpus)))

            wait_for(offered, lambda: "the node's allocatable amd.com/gpu", timeout=30)
            yield plugin
        finally:
            plugin.stop()


def test_flows_and_execs_of_a_pods_first_instant_are_attributed(lens: KubeNode) -> None:
    """A client Deployment connects to a server pod the moment it starts, before the agent
    can know its address; each side's flows carry the other's pod and the Deployment the
    real controllers made, exact, with no unlabelled leftover and one spelling. Not while
    the other worker floods the host with flows (the agent's map full, these flows would
    land in its overflow slot)."""
    with flow_flood(exclusive=False):
        first_instant(lens)


def first_instant(lens: KubeNode) -> None:
    apply(lens, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": APP}})
    apply(
        lens,
        deployment(
            "web",
            [
                "sh",
                "-c",
                f"mkdir -p /www && echo hi > /www/index.html"
                f" && exec httpd -f -p {WEB_PORT} -h /www",
            ],
        ),
    )
    [web] = lens.wait_pods(APP, "app=web", lambda p: running_and_ready(p))
    web_ip = web["status"]["podIP"]
    fetches = "; ".join([f"wget -q -O /dev/null http://{web_ip}:{WEB_PORT}/"] * CONNECTIONS)
    apply(lens, deployment("client", ["sh", "-c", f"{fetches}; exec sleep 3600"]))
    [client] = lens.wait_pods(APP, "app=client", lambda p: running_and_ready(p))
    client_ip = client["status"]["podIP"]
    rs = client["metadata"]["ownerReferences"][0]
    assert rs["kind"] == "ReplicaSet"  # written by the Deployment controller

    def flows() -> tuple[list, list]:
        text = http_get(f"http://{lab.NODE_IP}:9470/metrics")[1]
        opened = samples(text, "lens_tcp_connections_opened_total")
        egress = [(lb, v) for lb, v in opened if lb.get("raddr") == web_ip]
        ingress = [(lb, v) for lb, v in opened if lb.get("raddr") == client_ip]
        return egress, ingress

    def counted() -> bool:
        egress, ingress = flows()
        total = sum(v for _, v in egress) + sum(v for _, v in ingress)
        return total >= 2 * CONNECTIONS and all(lb.get("remote_pod") for lb, _ in egress + ingress)

    def story() -> str:
        text = http_get(f"http://{lab.NODE_IP}:9470/metrics")[1]
        full = [ln for ln in text.splitlines() if ln.startswith("lens_agent_bpf_map_full")]
        return f"{CONNECTIONS} flows each way, attributed: {flows()} (maps full: {full})"

    wait_for(counted, story, timeout=90)
    egress, ingress = flows()
    who = (
        "direction",
        "type",
        "port",
        "remote_namespace",
        "remote_pod",
        "remote_workload_kind",
        "remote_workload",
    )
    web_pod, client_pod = web["metadata"]["name"], client["metadata"]["name"]
    assert [(tuple(lb[k] for k in who), v) for lb, v in egress] == [
        (("egress", "k8sPod", str(WEB_PORT), APP, web_pod, "Deployment", "web"), CONNECTIONS)
    ]
    assert [(tuple(lb[k] for k in who), v) for lb, v in ingress] == [
        (("ingress", "k8sPod", str(WEB_PORT), APP, client_pod, "Deployment", "client"), CONNECTIONS)
    ]
    text = http_get(f"http://{lab.NODE_IP}:9470/metrics")[1]
    assert "::ffff:" not in text


def metrics() -> str:
    status, text = http_get(f"http://{lab.NODE_IP}:9470/metrics")
    assert status == 200, text[:300]
    return text


class AgentExecs:
    """The agent's process_exec events of one pod of APP over its gRPC port (9471), as the
    recorder reads them: with a token of the recorder's ServiceAccount for the port's
    audience (lens-ebpf-agent), checked by TokenReview. Subscribed from the agent's
    newest event before the pod starts: the agent records the whole host, and make
    test's other worker's bursts (a million connects, ten thousand execs) can push the
    pod's events out of its history (100,000) before a replay from the first would come."""

    def __init__(self, node: KubeNode, pod: str) -> None:
        import threading

        import grpc

        from lens_ebpf.protocol.gen import lens_pb2 as pb
        from lens_ebpf.protocol.gen import lens_pb2_grpc

        sa = f"/api/v1/namespaces/{NS}/serviceaccounts/lens-ebpf-recorder/token"
        status, got = node.request(
            "POST",
            sa,
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"audiences": ["lens-ebpf-agent"], "expirationSeconds": 600},
            },
        )
        assert status == 201, got
        auth = (("authorization", f"Bearer {got['status']['token']}"),)
        self.channel = grpc.insecure_channel(f"{lab.NODE_IP}:9471")
        newest = (
            lens_pb2_grpc.NodeServiceStub(self.channel)
            .GetNode(pb.GetNodeRequest(), metadata=auth, timeout=hang_guard(10))
            .last_seq
        )
        req = pb.SubscribeRequest(
            kinds=["process_exec"], namespace=APP, pod=pod, from_seq=newest + 1
        )
        self.stream = lens_pb2_grpc.EventServiceStub(self.channel).Subscribe(req, metadata=auth)
        self.events: list[Any] = []  # process_exec payloads
        self.gaps: list[Any] = []  # what the agent said it could not send
        self.thread = threading.Thread(target=self._read, args=(grpc.RpcError,), daemon=True)
        self.thread.start()

    def _read(self, rpc_error: type[Exception]) -> None:
        with contextlib.suppress(rpc_error):  # cancelled by close()
            for ev in self.stream:
                if ev.HasField("process_exec"):
                    self.events.append(ev.process_exec)
                else:
                    self.gaps.append(ev.gap)

    def wait(self, until: Callable[[list[Any]], bool], what: str) -> list[Any]:
        wait_for(
            lambda: until(list(self.events)),
            lambda: f"{what} from the agent: {self.events} (gaps {self.gaps})",
            timeout=60,
        )
        return list(self.events)

    def close(self) -> None:
        self.stream.cancel()
        self.channel.close()
        self.thread.join(5)


def test_execs_and_an_oom_kill_are_the_containers_the_kubelet_ran(
    lens: KubeNode, request: pytest.FixtureRequest
) -> None:
    """Each exec an event under its pod and container (five: sh, three /bin/busybox true,
    the exec of sleep), the same count on /metrics (runc's re-exec of itself from a memfd
    counts too when it falls in the container's cgroup: the events say which), the
    sandbox's under "POD";
    the OOM kill the kubelet reports as OOMKilled counted once under its pod."""
    apply(lens, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": APP}})
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": APP},
        "spec": {
            "restartPolicy": "Never",
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 1,
        },
    }
    execs = "/bin/busybox true; /bin/busybox true; /bin/busybox true; exec /bin/busybox sleep 3600"
    hog = "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo survived"
    reader = AgentExecs(lens, "execs")
    request.addfinalizer(reader.close)
    apply(
        lens,
        {
            **pod,
            "metadata": {"name": "execs", "namespace": APP},
            "spec": {
                **pod["spec"],
                "containers": [
                    {
                        "name": "execs",
                        "image": images.BUSYBOX,
                        "command": ["/bin/busybox", "sh", "-c", execs],
                    }
                ],
            },
        },
        {
            **pod,
            "metadata": {"name": "hog", "namespace": APP},
            "spec": {
                **pod["spec"],
                "containers": [
                    {
                        "name": "hog",
                        "image": images.BUSYBOX,
                        "command": ["sh", "-c", hog],
                        "resources": {"limits": {"memory": "32Mi"}},
                    }
                ],
            },
        },
    )
    lens.wait_pods(APP, "", lambda p: p["metadata"]["name"] == "execs" and running_and_ready(p))

    def oom_killed() -> bool:
        st = lens.pod(APP, "hog")["status"].get("containerStatuses") or [{}]
        return bool(st[0].get("state", {}).get("terminated", {}).get("reason") == "OOMKilled")

    wait_for(oom_killed, lambda: "hog OOMKilled: " + lens._pod_story(APP, ""), timeout=60)

    def runc_reexec(e: Any) -> bool:
        return bool(e.filename.startswith(("/dev/fd/", "/proc/self/fd/")))

    def ours(events: list[Any]) -> list[Any]:  # runc's re-exec from a memfd set apart
        return [e for e in events if e.identity.container == "execs" and not runc_reexec(e)]

    events = reader.wait(lambda events: len(ours(events)) >= 5, "the execs pod's execs")
    assert reader.gaps == []
    # sh, three /bin/busybox true, the exec of sleep
    assert [(e.filename, e.comm) for e in ours(events)] == [("/bin/busybox", "busybox")] * 5
    assert {(e.identity.namespace, e.identity.pod) for e in events} == {(APP, "execs")}
    mine = {c: sum(1 for e in events if e.identity.container == c) for c in ("execs", "POD")}

    def counted() -> dict[tuple[str, str, str], float]:
        got: dict[tuple[str, str, str], float] = {}
        text = metrics()
        for kind, family in (
            ("exec", "lens_container_process_execs_total"),
            ("oom", "lens_container_oom_kills_total"),
        ):
            for lb, v in samples(text, family):
                if lb.get("namespace") == APP and lb.get("pod") in ("execs", "hog"):
                    got[(kind, lb["pod"], lb["container"])] = v
        return got

    def settled() -> bool:
        got = counted()
        return got.get(("exec", "execs", "execs")) == mine["execs"] and ("oom", "hog", "hog") in got

    wait_for(settled, lambda: f"the execs {mine} and the OOM kill: {counted()}", timeout=60)
    got = counted()
    sandbox = [e for e in events if e.identity.container == "POD"]
    assert got[("exec", "execs", "POD")] == len(sandbox), sandbox
    # the pause container's exec; runc's re-exec of itself from a memfd too, where it falls
    # in the sandbox's cgroup
    assert [e.filename for e in sandbox if not runc_reexec(e)] == ["/pause"], sandbox
    assert got[("oom", "hog", "hog")] == 1
    assert all(len(container) < 64 for _, _, container in got), got


def test_the_kubelets_stats_are_the_agents_ephemeral_storage(lens: KubeNode) -> None:
    """node_ephemeral_storage_* and pod_ephemeral_storage_usage_bytes from the kubelet's
    /stats/summary (through the agent's own ServiceAccount token and RBAC): the node's
    capacity, and one series for each pod the summary measures (a new pod's first
    measure comes with the kubelet's next housekeeping)."""
    agent = lens.pods(NS, "app.kubernetes.io/name=lens-ebpf")[0]["metadata"]["name"]
    seen: list[Any] = []

    def same() -> bool:
        summary = lens.get(f"/api/v1/nodes/{lab.NODE_NAME}/proxy/stats/summary")
        text = metrics()
        theirs = {
            (p["podRef"]["namespace"], p["podRef"]["name"])
            for p in summary["pods"]
            if "ephemeral-storage" in p
        }
        ours = {
            (lb["namespace"], lb["pod"])
            for lb, _ in samples(text, "pod_ephemeral_storage_usage_bytes")
        }
        capacity = samples(text, "node_ephemeral_storage_capacity_bytes")
        seen[:] = [theirs, ours, capacity, summary["node"]["fs"]["capacityBytes"]]
        return (
            ours == theirs
            and (NS, agent) in ours
            and capacity == [({"node": lab.NODE_NAME}, summary["node"]["fs"]["capacityBytes"])]
        )

    wait_for(
        same, lambda: f"the summary's pods and capacity on /metrics: {seen}", timeout=90, every=2
    )


def pod_resources() -> dict[str, tuple[str, str, str]]:
    """device id -> (namespace, pod, container): the kubelet's own PodResources List."""
    import grpc

    from lens_ebpf.k8s.gen import podresources_v1_pb2 as pb
    from lens_ebpf.k8s.gen import podresources_v1_pb2_grpc as pb_grpc

    sock = lab.KUBELET_ROOT / "pod-resources" / "kubelet.sock"
    with grpc.insecure_channel(f"unix://{sock}") as channel:
        resp = pb_grpc.PodResourcesListerStub(channel).List(
            pb.ListPodResourcesRequest(), timeout=10
        )
    return {
        dev: (p.namespace, p.name, c.name)
        for p in resp.pod_resources
        for c in p.containers
        for d in c.devices
        if d.resource_name == "amd.com/gpu"
        for dev in d.device_ids
    }


def recorder_workloads() -> dict[str, dict[str, Any]]:
    status, body = http_get(f"http://{lab.RECORDER_IP}:9480/v1/workloads?namespace={APP}")
    assert status == 200, body
    return {w["name"]: w for w in json.loads(body)["data"]["data"]}


def test_gpu_workloads_from_the_device_plugin_to_the_agent_and_the_recorder(
    lens: KubeNode, gpu_plugin: Any
) -> None:
    """A Job and a Deployment ask for amd.com/gpu; the scheduler places them, the kubelet
    allocates through the plugin; the agent's lens_k8s_device_allocated is the kubelet's
    PodResources; the recorder follows the Job from creation to completion with its
    finalizer and to deletion, and the Deployment as Running while its pod runs."""
    apply(lens, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": APP}})
    train = job("train", ["sh", "-c", "sleep 20"], gpus=1)
    apply(lens, train, deployment("serve", ["sleep", "3600"], gpus=1))
    lens.wait_pods(APP, "job-name=train", lambda p: p["status"].get("phase") == "Running")
    lens.wait_pods(APP, "app=serve", running_and_ready)

    def allocated() -> set[tuple[str, str, str, str]]:
        return {
            (lb["device_id"], lb["namespace"], lb["pod"], lb["container"])
            for lb, v in samples(metrics(), "lens_k8s_device_allocated")
            if lb["resource"] == "amd.com/gpu" and v == 1
        }

    kubelet = pod_resources()
    assert sorted(kubelet) == sorted(gpu_plugin.gpus)  # both GPUs, one each
    assert sorted(gpu_plugin.allocated) == sorted([d] for d in gpu_plugin.gpus)
    want = {(dev, *who) for dev, who in kubelet.items()}
    wait_for(lambda: allocated() == want, lambda: f"{want} on /metrics: {allocated()}", timeout=30)

    made = lens.get(f"/apis/batch/v1/namespaces/{APP}/jobs/train")
    assert "lens-ebpf.io/recorder" in made["metadata"].get("finalizers", [])

    def status(name: str) -> str:
        return str(recorder_workloads().get(name, {}).get("status", ""))

    wait_for(
        lambda: status("train") == "Running" and status("serve") == "Running",
        lambda: f"Running workloads: {recorder_workloads()}",
        timeout=30,
    )
    assert recorder_workloads()["train"]["gpu_allocated"] == 1

    def train_seen() -> str:  # the API's Job and pods beside the recorder's, for a failure
        api = lens.get(f"/apis/batch/v1/namespaces/{APP}/jobs/train").get("status", {})
        pods = [
            (p["metadata"]["name"], p["status"].get("phase"), p["status"].get("containerStatuses"))
            for p in lens.pods(APP, "job-name=train")
        ]
        mine = recorder_workloads()
        return f"train Done: the API's Job {api}, its pods {pods}; the recorder's {mine}"

    wait_for(lambda: status("train") == "Done", train_seen, timeout=90)
    done = recorder_workloads()["train"]
    assert done["end_at"] > done["start_at"] and done["uid"] == made["metadata"]["uid"]
    lens.kubectl("delete", "job", "train", "-n", APP, "--wait=false")

    def gone() -> bool:
        return lens.request("GET", f"/apis/batch/v1/namespaces/{APP}/jobs/train")[0] == 404

    wait_for(gone, "the Job deleted (the recorder's finalizer taken off)", timeout=60)
    assert status("train") == "Deleted" and status("serve") == "Running"


def test_the_helm_chart_brings_lens_ebpf_up_on_the_node(lens: KubeNode) -> None:
    """The kubectl install taken down (kubectl delete -k; its namespace ends in the
    background), then the chart's default values (the agent and the single recorder)
    rendered by Helm's own library for this cluster's version into a release namespace of
    its own and applied: both pods Ready by their probes, the agents' reporter connected
    to the chart's recorder through its Service and TokenReview. The lab's two additions
    as with kubectl: the recorder's Service address (a post-render edit: the chart has no
    value for it) and a PersistentVolume."""
    helm = pytest.importorskip("helm_python", reason="helm-python-sdk is not installed")
    from tests.kube.test_manifests import KUBE_1_20, render

    lens.kubectl("delete", "-k", str(OVERLAY), "--wait=false", "--grace-period=1", timeout=120)
    # the agent's hostNetwork ports are free once its pod is gone
    wait_for(
        lambda: not lens.pods(NS, "app.kubernetes.io/name=lens-ebpf"),
        "the kubectl install's agent gone",
        timeout=120,
    )
    release, address = "lens-helm", "10.213.192.73"
    with helm.Chart.load(Path(__file__).resolve().parents[2] / "charts" / "lens-ebpf") as chart:
        values = {"agent": {"reporterTarget": f"{address}:9472"}}
        docs = render(chart, values, namespace=release, kube_version=KUBE_1_20)
    for doc in docs:
        if (doc["kind"], doc["metadata"]["name"]) == ("Service", "lens-ebpf-recorder"):
            doc["spec"]["clusterIP"] = address
    volume = yaml.safe_load((OVERLAY / "volume.yaml").read_text())
    volume["metadata"]["name"] = "lens-node-recorder-helm"
    apply(lens, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": release}})
    apply(lens, volume, *docs)
    lens.wait_pods(release, "app.kubernetes.io/name=lens-ebpf", running_and_ready, timeout=240)
    lens.wait_pods(
        release, "app.kubernetes.io/name=lens-ebpf-recorder", running_and_ready, timeout=240
    )

    def reporting() -> bool:
        return [v for _, v in samples(metrics(), "lens_agent_reporter_connected")] == [1.0]

    def story() -> str:
        """The reporter's metrics and both pods' last log lines, for the failure."""
        text = metrics()
        said = [ln for ln in text.splitlines() if ln.startswith("lens_agent_reporter_")]
        logs = [
            lens.kubectl(
                "logs", "-n", release, "--tail=15", "-l", f"{APP_LABEL}={app}", check=False
            ).stdout
            for app in ("lens-ebpf", "lens-ebpf-recorder")
        ]
        return "the agents' reporter connected to the chart's recorder:\n" + "\n".join(said + logs)

    wait_for(reporting, story, timeout=60)
    assert http_get(f"http://{address}:9480/readyz")[0] == 200
