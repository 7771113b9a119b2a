"""A real Kubernetes node for tests: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kube-proxy and a kubelet on containerd (CRI), all built or installed from
Debian's archive (tests/kube/build.py), in a network namespace of their own.

The layout (measured facts and the one setting this machine needs: ../shared/REAL-NODE.md):

- Every daemon runs in the namespace `lens-node` (`nsenter --net=`), whose `lo` holds the
  node's address (NODE_IP). The host reaches it over a veth pair (host side VETH_HOST,
  HOST_IP): a route on the host sends NODE_NET through it, so the tests talk to the API
  server, the pods and the Services' addresses (kube-proxy's rules apply to what enters
  the namespace) with plain sockets. Nothing leaves the machine.
- Pods get their own namespaces from CNI on the bridge `cni0` (POD_CIDR, host-local,
  masquerade, hairpin); Services take SERVICE_CIDR, served by kube-proxy's iptables rules
  inside the namespace. No cluster DNS runs: a pod names a Service by its address.
- containerd and the kubelet use the paths a node has, so the agent's DaemonSet mounts
  them unchanged: containerd's state and socket under /run/containerd, the kubelet's root
  /var/lib/kubelet (its PodResources socket in pod-resources/). The lab refuses to start
  where another containerd or kubelet uses them. containerd's root (images, snapshots)
  is the lab's own directory.
- The kubelet's cgroups go under CGROUP_ROOT in every v1 hierarchy.
- This machine lacks CAP_SYS_RESOURCE, so nothing may lower an OOM score: containerd's
  CRI restricts oom_score_adj (pods run at 0, not -998/-997) and the daemons keep their own.
- The kubelet sets kernel tunables of the host when it starts (vm.overcommit_memory,
  kernel.panic, kernel.panic_on_oops); the lab puts back what it found.

    node = KubeNode().start()        # about 25 s to a Ready node on 2 cores
    node.import_images()             # tests/kube/images.py's, into containerd's k8s.io
    node.kubectl("apply", "-f", "-", input=yaml_text)
    node.wait_pod_phase("default", "web", "Running")
    node.stop()                      # everything killed, unmounted and removed
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.conftest import hang_guard, wait_for
from tests.kube import build, images
from tests.kube.apiserver import KubectlError, _tail, api_request

NETNS = "lens-node"
NODE_NAME = "lens-node"
NODE_IP = "10.213.0.1"
NODE_NET = "10.213.0.0/16"  # the node, its pods and its Services, as the host routes them
HOST_IP, PEER_IP = "10.213.255.1", "10.213.255.2"  # the veth pair's two ends (/30)
VETH_HOST, VETH_PEER = "lensnode0", "eth0"
POD_CIDR = "10.213.128.0/24"
SERVICE_CIDR = "10.213.192.0/24"
API_SERVICE_IP = "10.213.192.1"  # the first of SERVICE_CIDR: the `kubernetes` Service
RECORDER_IP = "10.213.192.72"  # the recorder's Service (tests/kube/lab/recorder-address.yaml)
VOLUMES = Path("/var/lib/lens-node")  # hostPath PersistentVolumes (tests/kube/lab/volume.yaml)
API_PORT = 6443
CGROUP_ROOT = "/lens-node"
CONTAINERD_STATE = Path("/run/containerd")
CONTAINERD_SOCK = CONTAINERD_STATE / "containerd.sock"
KUBELET_ROOT = Path("/var/lib/kubelet")
# containerd's root (content, snapshots, metadata) is kept between labs, so that the
# images are imported once per build of them (the agent's: ~1.2 GB, ~90 s to import)
CONTAINERD_ROOT = build.CACHE.parent / "node" / "containerd"
IMPORTED = CONTAINERD_ROOT / "lens-imported.json"  # archive -> its size and mtime
POD_LOGS = (Path("/var/log/pods"), Path("/var/log/containers"))  # kubelet 1.20 hard-codes
CNI_BIN = Path("/usr/lib/cni")
ADMIN = "lab-admin"
KERNEL_TUNABLES = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")


def unavailable() -> str:
    """Why the node cannot start here; empty when it can."""
    if os.geteuid() != 0:
        return "the real node lab runs as root"
    if build.cached() is None:
        why = f"the node's binaries are not in {build.CACHE}"
        with contextlib.suppress(OSError):
            why += f" (the last build failed: {build.ERROR.read_text().strip()[:300]})"
        return f"{why}: run python -m tests.kube.build (scripts/setup.sh test does)"
    for tool in (
        "etcd",
        "openssl",
        "containerd",
        "containerd-shim-runc-v2",
        "runc",
        "ctr",
        "iptables",
        "conntrack",
        "nsenter",
        "ip",
    ):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/setup.sh test installs it)"
    for plugin in ("bridge", "host-local", "loopback", "portmap"):
        if not (CNI_BIN / plugin).is_file():
            return f"{CNI_BIN / plugin} is missing (containernetworking-plugins)"
    if not Path("/sys/fs/cgroup/cpuset").is_dir():
        return "the lab's kubelet config is for cgroup v1 hierarchies (cpuset not mounted)"
    if Path(f"/run/netns/{NETNS}").exists():
        return ""  # a lab killed before it could stop, whose daemons answer: start() sweeps it
    if CONTAINERD_SOCK.exists():
        with socket.socket(socket.AF_UNIX) as s, contextlib.suppress(OSError):
            s.connect(str(CONTAINERD_SOCK))
            return f"another containerd answers on {CONTAINERD_SOCK}"
    if _pids("kubelet"):
        return "another kubelet runs on this machine"
    return ""


def _pids(comm: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if (d / "comm").read_text().strip() == comm:
                    out.append(int(d.name))
    return out


def _run(
    *cmd: str, check: bool = True, timeout: float = 30, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        cmd, capture_output=True, text=True, input=input, timeout=hang_guard(timeout)
    )
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()[-600:]}")
    return r


class KubeNode:
    """One node and its control plane; start() brings it to Ready, stop() removes it all."""

    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="lens-node-"))
        self.pki = self.base / "pki"
        self.url = f"https://{NODE_IP}:{API_PORT}"
        self.admin_token = secrets.token_hex(16)
        self.admin_kubeconfig = self.base / "admin.kubeconfig"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.tunables: dict[str, str] = {}
        self.started_in = 0.0
        self._ssl: ssl.SSLContext | None = None
        self._state_before: set[str] | None = None  # what /run/containerd held before

    # -- certificates and kubeconfigs ----------------------------------------------------

    def _openssl(self, *args: str) -> None:
        _run("openssl", *args)

    def _cert(self, name: str, subject: str, ext: str) -> None:
        """pki/<name>.crt and .key, signed by the lab's CA."""
        d = self.pki
        (d / f"{name}.ext").write_text(ext)
        self._openssl(
            "req",
            "-new",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(d / f"{name}.key"),
            "-out",
            str(d / f"{name}.csr"),
            "-subj",
            subject,
        )
        self._openssl(
            "x509",
            "-req",
            "-in",
            str(d / f"{name}.csr"),
            "-CA",
            str(d / "ca.crt"),
            "-CAkey",
            str(d / "ca.key"),
            "-CAcreateserial",
            "-days",
            "30",
            "-extfile",
            str(d / f"{name}.ext"),
            "-out",
            str(d / f"{name}.crt"),
        )

    def _certificates(self) -> None:
        d = self.pki
        d.mkdir()
        self._openssl(
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(d / "ca.key"),
            "-out",
            str(d / "ca.crt"),
            "-days",
            "30",
            "-subj",
            "/CN=lens-node-ca",
        )
        client = "extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n"
        server = "extendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n"
        sans = (
            f"subjectAltName=IP:127.0.0.1,IP:{NODE_IP},IP:{API_SERVICE_IP},"
            "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
            "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
        )
        self._cert("apiserver", "/CN=kube-apiserver", sans + server)
        self._cert(
            "kubelet-serving",
            f"/CN={NODE_NAME}",
            f"subjectAltName=IP:{NODE_IP},DNS:{NODE_NAME}\n" + server,
        )
        for name, subject in (
            ("apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client"),
            ("controller-manager", "/CN=system:kube-controller-manager"),
            ("scheduler", "/CN=system:kube-scheduler"),
            ("kube-proxy", "/CN=system:kube-proxy"),
            ("kubelet", f"/O=system:nodes/CN=system:node:{NODE_NAME}"),
        ):
            self._cert(name, subject, client)
        self._openssl("genrsa", "-out", str(d / "sa.key"), "2048")
        self._openssl("rsa", "-in", str(d / "sa.key"), "-pubout", "-out", str(d / "sa.pub"))
        (d / "tokens.csv").write_text(f'{self.admin_token},{ADMIN},{ADMIN},"system:masters"\n')
        ca = base64.b64encode((d / "ca.crt").read_bytes()).decode()
        for name in ("controller-manager", "scheduler", "kube-proxy", "kubelet"):
            user = {
                "client-certificate": str(d / f"{name}.crt"),
                "client-key": str(d / f"{name}.key"),
            }
            self._kubeconfig(self.base / f"{name}.kubeconfig", ca, name, user)
        self._kubeconfig(self.admin_kubeconfig, ca, ADMIN, {"token": self.admin_token})
        self._ssl = ssl.create_default_context(cafile=str(d / "ca.crt"))

    def _kubeconfig(self, path: Path, ca: str, user: str, creds: dict[str, str]) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "lab",
            "clusters": [
                {"name": "lab", "cluster": {"server": self.url, "certificate-authority-data": ca}}
            ],
            "users": [{"name": user, "user": creds}],
            "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": user}}],
        }
        path.write_text(json.dumps(config, indent=1) + "\n")
        path.chmod(0o600)

    # -- the namespace, cgroups, tunables ------------------------------------------------

    def _netns(self) -> None:
        _run("ip", "netns", "del", NETNS, check=False)
        _run("ip", "link", "del", VETH_HOST, check=False)
        _run("ip", "netns", "add", NETNS)
        inside = ("ip", "netns", "exec", NETNS)
        _run(*inside, "ip", "link", "set", "lo", "up")
        _run(*inside, "ip", "addr", "add", f"{NODE_IP}/32", "dev", "lo")
        _run(
            "ip",
            "link",
            "add",
            VETH_HOST,
            "type",
            "veth",
            "peer",
            "name",
            VETH_PEER,
            "netns",
            NETNS,
        )
        _run("ip", "addr", "add", f"{HOST_IP}/30", "dev", VETH_HOST)
        _run("ip", "link", "set", VETH_HOST, "up")
        _run(*inside, "ip", "addr", "add", f"{PEER_IP}/30", "dev", VETH_PEER)
        _run(*inside, "ip", "link", "set", VETH_PEER, "up")
        _run(*inside, "ip", "route", "add", "default", "via", HOST_IP)
        _run(*inside, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        _run("ip", "route", "replace", NODE_NET, "via", PEER_IP, "dev", VETH_HOST)

    def _cgroups(self) -> None:
        """CGROUP_ROOT in every v1 hierarchy; cpuset needs its cpus and mems first."""
        for h in Path("/sys/fs/cgroup").iterdir():
            if h.is_dir() and not h.is_symlink() and (h / "cgroup.procs").exists():
                d = h / CGROUP_ROOT.strip("/")
                d.mkdir(exist_ok=True)
                if h.name == "cpuset":
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        (d / f).write_text((h / f).read_text())

    def _save_tunables(self) -> None:
        for t in KERNEL_TUNABLES:
            with contextlib.suppress(OSError):
                self.tunables[t] = (Path("/proc/sys") / t).read_text().strip()

    def _restore_tunables(self) -> None:
        for t, v in self.tunables.items():
            with contextlib.suppress(OSError):
                (Path("/proc/sys") / t).write_text(v)

    # -- daemons ---------------------------------------------------------------------------

    def _spawn(self, name: str, args: Sequence[str], env: dict[str, str] | None = None) -> None:
        log = (self.base / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{NETNS}", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        log.close()

    def _alive(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            raise RuntimeError(
                f"{name} exited {proc.returncode}:\n" f"{_tail(self.base / f'{name}.log')}"
            )

    def _start_etcd(self) -> None:
        client, peer = "http://127.0.0.1:2379", "http://127.0.0.1:2380"
        self._spawn(
            "etcd",
            [
                "etcd",
                "--name",
                "lab",
                "--data-dir",
                str(self.base / "etcd"),
                "--listen-client-urls",
                client,
                "--advertise-client-urls",
                client,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                f"lab={peer}",
            ],
        )

    def _start_apiserver(self) -> None:
        d = self.pki
        self._spawn(
            "kube-apiserver",
            [
                str(build.APISERVER),
                "--etcd-servers=http://127.0.0.1:2379",
                "--bind-address=0.0.0.0",
                f"--advertise-address={NODE_IP}",
                f"--secure-port={API_PORT}",
                "--insecure-port=0",
                f"--cert-dir={d}",
                f"--tls-cert-file={d / 'apiserver.crt'}",
                f"--tls-private-key-file={d / 'apiserver.key'}",
                f"--client-ca-file={d / 'ca.crt'}",
                f"--token-auth-file={d / 'tokens.csv'}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                f"--kubelet-client-certificate={d / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={d / 'apiserver-kubelet-client.key'}",
                f"--kubelet-certificate-authority={d / 'ca.crt'}",
                "--kubelet-preferred-address-types=InternalIP",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-signing-key-file={d / 'sa.key'}",
                f"--service-account-key-file={d / 'sa.pub'}",
                "--api-audiences=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                "--profiling=false",
            ],
        )

    def _start_controllers(self) -> None:
        d = self.pki
        kcm = str(self.base / "controller-manager.kubeconfig")
        self._spawn(
            "kube-controller-manager",
            [
                str(build.CONTROLLER_MANAGER),
                f"--kubeconfig={kcm}",
                f"--authentication-kubeconfig={kcm}",
                f"--authorization-kubeconfig={kcm}",
                "--port=0",
                "--bind-address=127.0.0.1",
                "--leader-elect=false",
                f"--service-account-private-key-file={d / 'sa.key'}",
                f"--root-ca-file={d / 'ca.crt'}",
                f"--cluster-signing-cert-file={d / 'ca.crt'}",
                f"--cluster-signing-key-file={d / 'ca.key'}",
                "--use-service-account-credentials=true",
                "--profiling=false",
            ],
        )
        sched = str(self.base / "scheduler.kubeconfig")
        self._spawn(
            "kube-scheduler",
            [
                str(build.SCHEDULER),
                f"--kubeconfig={sched}",
                f"--authentication-kubeconfig={sched}",
                f"--authorization-kubeconfig={sched}",
                "--port=0",
                "--bind-address=127.0.0.1",
                "--leader-elect=false",
                "--profiling=false",
            ],
        )
        self._spawn(
            "kube-proxy",
            [
                str(build.PROXY),
                f"--kubeconfig={self.base / 'kube-proxy.kubeconfig'}",
                f"--hostname-override={NODE_NAME}",
                f"--cluster-cidr={POD_CIDR}",
                "--proxy-mode=iptables",
                "--oom-score-adj=0",
                "--conntrack-max-per-core=0",
                "--conntrack-tcp-timeout-established=0s",
                "--conntrack-tcp-timeout-close-wait=0s",
                "--metrics-bind-address=127.0.0.1:10249",
                "--healthz-bind-address=127.0.0.1:10256",
            ],
        )

    def _containerd_config(self) -> Path:
        cni = self.base / "cni"
        cni.mkdir()
        (cni / "10-lens-node.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "0.4.0",
                    "name": "lens-node",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": "cni0",
                            "isGateway": True,
                            "ipMasq": True,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": POD_CIDR}]],
                                "routes": [{"dst": "0.0.0.0/0"}],
                            },
                        },
                        {"type": "portmap", "capabilities": {"portMappings": True}},
                    ],
                },
                indent=1,
            )
        )
        config = self.base / "containerd.toml"
        root = CONTAINERD_ROOT
        root.mkdir(parents=True, exist_ok=True)
        config.write_text(f"""version = 2
root = "{root}"
state = "{CONTAINERD_STATE}"
oom_score = 0
[grpc]
  address = "{CONTAINERD_SOCK}"
[ttrpc]
  address = "{CONTAINERD_SOCK}.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{images.PAUSE}"
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{shutil.which("runc")}"
        Root = "{self.base / "runc"}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni}"
""")
        return config

    def _start_containerd(self) -> None:
        config = self._containerd_config()
        self._state_before = (
            set(os.listdir(CONTAINERD_STATE)) if CONTAINERD_STATE.exists() else set()
        )
        CONTAINERD_STATE.mkdir(parents=True, exist_ok=True)
        self._spawn("containerd", ["containerd", "--config", str(config)])

        def up() -> bool:
            self._alive("containerd")
            return self.ctr("version", check=False).returncode == 0

        wait_for(
            up,
            lambda: f"containerd on {CONTAINERD_SOCK}:\n" f"{_tail(self.base / 'containerd.log')}",
            timeout=30,
        )

    def _start_kubelet(self) -> None:
        d = self.pki
        static = self.base / "manifests"
        static.mkdir()
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": CGROUP_ROOT,
            "failSwapOn": False,
            "readOnlyPort": 0,
            "staticPodPath": str(static),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(d / "ca.crt")},
            },
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": str(d / "kubelet-serving.crt"),
            "tlsPrivateKeyFile": str(d / "kubelet-serving.key"),
            "address": NODE_IP,
            "healthzBindAddress": "127.0.0.1",
            "resolvConf": "/etc/resolv.conf",
            "oomScoreAdj": 0,
            "syncFrequency": "10s",
            "nodeStatusUpdateFrequency": "4s",
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
        }
        (self.base / "kubelet.yaml").write_text(json.dumps(config, indent=1))
        KUBELET_ROOT.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PATH": os.environ.get("PATH", "") + ":/usr/sbin:/sbin"}
        self._spawn(
            "kubelet",
            [
                str(build.KUBELET),
                f"--config={self.base / 'kubelet.yaml'}",
                f"--kubeconfig={self.base / 'kubelet.kubeconfig'}",
                "--container-runtime=remote",
                f"--container-runtime-endpoint=unix://{CONTAINERD_SOCK}",
                f"--image-service-endpoint=unix://{CONTAINERD_SOCK}",
                f"--containerd={CONTAINERD_SOCK}",
                f"--root-dir={KUBELET_ROOT}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={NODE_IP}",
                f"--cert-dir={self.base / 'kubelet-pki'}",
                "--v=1",
            ],
            env=env,
        )

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> KubeNode:
        """Bring the control plane and the node up; return once the node is Ready."""
        t0 = time.monotonic()
        try:
            if Path(f"/run/netns/{NETNS}").exists():
                sweep(keep=self.base)  # a lab that was killed before it could stop
            self._certificates()
            self._netns()
            self._cgroups()
            self._save_tunables()
            (VOLUMES / "recorder").mkdir(parents=True, exist_ok=True)
            (VOLUMES / "recorder").chmod(0o777)  # the recorder runs as 65534
            self._start_etcd()
            self._start_apiserver()
            wait_for(
                self._api_ready,
                lambda: "kube-apiserver /readyz:\n" + _tail(self.base / "kube-apiserver.log"),
                timeout=60,
                every=0.3,
            )
            self._start_controllers()
            self._start_containerd()
            self._start_kubelet()
            wait_for(
                self._node_ready,
                lambda: f"node {NODE_NAME} Ready:\n" + _tail(self.base / "kubelet.log"),
                timeout=90,
                every=0.5,
            )
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - t0
        return self

    def _api_ready(self) -> bool:
        self._alive("etcd")
        self._alive("kube-apiserver")
        try:
            return self.request("GET", "/readyz", timeout=2)[0] == 200
        except OSError:
            return False

    def _node_ready(self) -> bool:
        for name in self.procs:
            self._alive(name)
        status, node = self.request("GET", f"/api/v1/nodes/{NODE_NAME}")
        if status != 200:
            return False
        conditions = node.get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def stop(self) -> None:
        """Stop every daemon and container, unmount and remove what the lab made."""
        for name in ("kubelet", "kube-proxy", "kube-scheduler", "kube-controller-manager"):
            self._end(name)
        if "containerd" in self.procs:
            self._kill_containers()
        for name in ("containerd", "kube-apiserver", "etcd"):
            self._end(name)
        self._restore_tunables()
        made: set[str] = set()
        if self._state_before is not None:  # what the lab's containerd made there
            made = set(os.listdir(CONTAINERD_STATE)) - self._state_before
            made &= set(CONTAINERD_ENTRIES)
        _clean(made)
        if self._state_before is not None:
            with contextlib.suppress(OSError):
                CONTAINERD_STATE.rmdir()  # when it is empty: the lab made it
        _unmount_under(self.base)
        shutil.rmtree(self.base, ignore_errors=True)

    def _end(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=hang_guard(15))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _kill_containers(self) -> None:
        """Every container killed (SIGKILL to what runs in the lab's cgroups) and its
        task and container removed from containerd (the kubelet is stopped by now)."""
        _kill_leftovers(daemons=False)
        tasks = self.ctr("-n", "k8s.io", "tasks", "ls", "-q", check=False).stdout.split()
        for t in tasks:
            self.ctr("-n", "k8s.io", "tasks", "rm", "-f", t, check=False)
        # the kept root keeps images only: no sandbox or container for the next lab
        containers = self.ctr("-n", "k8s.io", "containers", "ls", "-q", check=False)
        if ids := containers.stdout.split():
            self.ctr("-n", "k8s.io", "containers", "rm", *ids, check=False)

    def import_images(self) -> list[str]:
        """tests/kube/images.py's archives into containerd's k8s.io namespace, those not
        imported already from the same archive; the names."""
        return images.import_missing(str(CONTAINERD_SOCK), IMPORTED)

    # -- clients ---------------------------------------------------------------------------

    def ctr(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return _run("ctr", "--address", str(CONTAINERD_SOCK), *args, check=check, timeout=timeout)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """The cached kubectl 1.20.2 as the admin."""
        cmd = [
            str(build.KUBECTL),
            f"--kubeconfig={self.admin_kubeconfig}",
            f"--cache-dir={self.base / 'kubectl-cache'}",
            *args,
        ]
        r = subprocess.run(
            cmd, input=input, capture_output=True, text=True, timeout=hang_guard(timeout)
        )
        if check and r.returncode != 0:
            raise KubectlError(
                f"kubectl {' '.join(args)} exited {r.returncode}: " f"{r.stderr.strip()}"
            )
        return r

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = None,
        timeout: float = 10,
    ) -> tuple[int, Any]:
        """One API request as the admin (or `token`): (status, decoded JSON or text)."""
        return api_request(
            self.url, self._ssl, token or self.admin_token, method, path, body, timeout
        )

    def get(self, path: str) -> Any:
        status, got = self.request("GET", path)
        if status != 200:
            raise RuntimeError(f"GET {path}: {status} {got}")
        return got

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        got: dict[str, Any] = self.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        return got

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        q = f"?labelSelector={selector}" if selector else ""
        items: list[dict[str, Any]] = self.get(f"/api/v1/namespaces/{namespace}/pods{q}")["items"]
        return items

    def wait_pods(
        self,
        namespace: str,
        selector: str,
        ready: Callable[[dict[str, Any]], bool],
        count: int = 1,
        timeout: float = 120,
    ) -> list[dict[str, Any]]:
        """The pods matching `selector` once `count` of them satisfy `ready`."""
        got: list[dict[str, Any]] = []

        def done() -> bool:
            nonlocal got
            self._alive("kubelet")
            got = [p for p in self.pods(namespace, selector) if ready(p)]
            return len(got) >= count

        wait_for(
            done,
            lambda: f"{count} pod(s) {selector} in {namespace}: "
            + self._pod_story(namespace, selector),
            timeout=timeout,
            every=0.5,
        )
        return got

    def _pod_story(self, namespace: str, selector: str) -> str:
        """What the pods and their events say, for a failure's message."""
        lines = []
        with contextlib.suppress(Exception):
            for p in self.pods(namespace, selector):
                st = p.get("status", {})
                lines.append(
                    f"{p['metadata']['name']} {st.get('phase')} "
                    f"{json.dumps(st.get('containerStatuses', []))[:600]}"
                )
            events = self.get(f"/api/v1/namespaces/{namespace}/events")["items"]
            lines += [
                f"  {e['involvedObject']['name']}: {e['reason']} {e['message'][:200]}"
                for e in events[-12:]
            ]
        return "\n".join(lines) + "\n" + _tail(self.base / "kubelet.log", 8)


def _unmount_under(top: Path) -> None:
    prefix = str(top).rstrip("/") + "/"
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefix) or point == str(top):
            mounts.append(point)
    for point in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def _kill_leftovers(daemons: bool = True) -> None:
    """SIGKILL every process in the lab's cgroups (every container) and, with `daemons`,
    in its network namespace (the daemons, the shims, the hostNetwork pods)."""
    pids: set[int] = set()
    lab_ns = Path(f"/run/netns/{NETNS}")
    if daemons and lab_ns.exists():
        inode = lab_ns.stat().st_ino
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                with contextlib.suppress(OSError):
                    if (d / "ns" / "net").stat().st_ino == inode:
                        pids.add(int(d.name))
    for h in Path("/sys/fs/cgroup").iterdir():
        top = h / CGROUP_ROOT.strip("/")
        if top.is_dir():
            for procs in top.rglob("cgroup.procs"):
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(x) for x in procs.read_text().split())
    pids.discard(os.getpid())
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.5 if pids else 0)


# what the lab's containerd makes under its state directory (/run/containerd) and the
# lab removes. Not `s`, `fifo` or `runc`: containerd 1.6's shims put their sockets and
# fifos there whichever containerd started them, the host tests' private ones too, and
# those may be running while the lab stops (make test's other worker)
CONTAINERD_ENTRIES = (
    "io.containerd.grpc.v1.cri",
    "io.containerd.runtime.v1.linux",
    "io.containerd.runtime.v2.task",
    "containerd.sock",
    "containerd.sock.ttrpc",
)


def _clean(state_entries: set[str]) -> None:
    """Kill what is left of a lab, unmount and remove what it made (of containerd's state
    directory, `state_entries`)."""
    _kill_leftovers()
    for top in (KUBELET_ROOT, CONTAINERD_STATE):
        _unmount_under(top)
    for h in Path("/sys/fs/cgroup").iterdir():
        top = h / CGROUP_ROOT.strip("/")
        if top.is_dir():
            for d in sorted(
                (p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
            ):
                with contextlib.suppress(OSError):
                    d.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()
    _run("ip", "route", "del", NODE_NET, check=False)
    _run("ip", "link", "del", VETH_HOST, check=False)
    _run("ip", "netns", "del", NETNS, check=False)
    for d in (KUBELET_ROOT, VOLUMES, *POD_LOGS):
        shutil.rmtree(d, ignore_errors=True)
    for entry in state_entries:
        path = CONTAINERD_STATE / entry
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def sweep(keep: Path | None = None) -> None:
    """What a lab killed before its stop() could run left behind (the next start calls
    this when the lab's network namespace is still there)."""
    _clean(set(CONTAINERD_ENTRIES))
    for old in Path(tempfile.gettempdir()).glob("lens-node-*"):
        if old == keep:
            continue
        _unmount_under(old)
        shutil.rmtree(old, ignore_errors=True)


def running_and_ready(pod: dict[str, Any]) -> bool:
    """Phase Running and every container ready (its readiness probe passed)."""
    st = pod.get("status", {})
    statuses = st.get("containerStatuses") or []
    return st.get("phase") == "Running" and bool(statuses) and all(s["ready"] for s in statuses)
