"""A real Kubernetes API server for tests: Debian's etcd and the kube-apiserver that
tests/kube/build.py builds into the cache, on 127.0.0.1 free ports, with its own CA.

What tests/k8slab.py's stand-in cannot show, this can: real authentication (a static admin
token, ServiceAccount tokens from the TokenRequest API), real RBAC (403 until a Role is
bound), real validation, admission and watch semantics. Nothing else of a control plane
runs: no controller-manager, scheduler or kubelet, so tests play them (a pod stays
Pending until a test writes its status; no token controller, hence the ServiceAccount
admission plugin is off and tokens come only from token_for()).

Quirks of 1.20.2 a test must know: CronJob is batch/v1beta1 (not batch/v1); the
`kubernetes` Service gets no Endpoints (--endpoint-reconciler-type=none: its address
would be loopback, which Endpoints validation refuses).

    lab = KubeApiServer().start()     # about 5 s to /readyz on 2 idle cores
    lab.kubectl("create", "namespace", "x")
    token = lab.token_for("x", "reader")
    lab.stop(); lab.start()           # etcd keeps running: the objects survive
    lab.destroy()

    lab = KubeApiServer(["--watch-cache=false"]).start()   # more flags: watches read etcd
    lab.compact()                     # every version seen so far: 410 to a watch from it
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
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.conftest import hang_guard, wait_for
from tests.kube import build

ISSUER = "https://kubernetes.default.svc.cluster.local"  # also the tokens' audience
ADMIN = "lab-admin"  # the static token's user, in system:masters


def unavailable() -> str:
    """Why the lab cannot start here; empty when it can."""
    if os.geteuid() != 0:
        return "the Kubernetes API server lab runs as root, as the suite's other labs do"
    if shutil.which("etcd") is None:
        return "Debian's etcd-server is not installed (scripts/setup.sh test installs it)"
    if shutil.which("openssl") is None:
        return "openssl is not installed (scripts/setup.sh test installs it)"
    if build.cached() is None:
        why = f"kube-apiserver and kubectl are not in {build.CACHE}"
        with contextlib.suppress(OSError):
            why += f" (the last build failed: {build.ERROR.read_text().strip()[:300]})"
        return f"{why}: run python -m tests.kube.build (scripts/setup.sh test does)"
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(
        ["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=hang_guard(30)
    )


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def api_request(
    url: str,
    context: ssl.SSLContext | None,
    token: str,
    method: str,
    path: str,
    body: Any = None,
    timeout: float = 10,
) -> tuple[int, Any]:
    """One request to an API server with a bearer token: (status, the decoded JSON body,
    or its text when not JSON). Error statuses are returned, not raised."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Accept", "application/json")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, context=context, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


class KubectlError(AssertionError):
    """kubectl exited non-zero; the message carries its stderr."""


class KubeApiServer:
    """etcd and kube-apiserver in a temp dir; stop()/kill()/start() take the API server
    down and back on the same port and certificates while etcd (and so every object)
    stays; destroy() ends both and removes the dir."""

    def __init__(self, extra_args: Sequence[str] = ()) -> None:
        """extra_args: more kube-apiserver flags, after (so overriding) the lab's own."""
        self.extra_args = list(extra_args)
        self.base = Path(tempfile.mkdtemp(prefix="lens-kube-"))
        self.port = _free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.etcd_port, self.etcd_peer_port = _free_port(), _free_port()
        self.admin_token = secrets.token_hex(16)
        self.ca = self.base / "ca.crt"
        self.admin_kubeconfig = self.base / "admin.kubeconfig"
        self.etcd: subprocess.Popen[bytes] | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_in = 0.0  # seconds from the last start() to /readyz
        self._certificates()
        self.write_kubeconfig(self.admin_kubeconfig, ADMIN, self.admin_token)
        self._ssl = ssl.create_default_context(cafile=str(self.ca))

    # -- set-up ------------------------------------------------------------------------

    def _certificates(self) -> None:
        """A CA, the serving certificate (SANs 127.0.0.1 and localhost: Go 1.19 checks no
        CN), the ServiceAccount signing key pair and the static admin token."""
        d = self.base
        _openssl(
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "30",
            "-subj",
            "/CN=lens-lab-ca",
            cwd=d,
        )
        (d / "serving.ext").write_text(
            "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,"
            "DNS:kubernetes.default,DNS:kubernetes.default.svc\n"
            "extendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n"
        )
        _openssl(
            "req",
            "-new",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "serving.key",
            "-out",
            "serving.csr",
            "-subj",
            "/CN=kube-apiserver",
            cwd=d,
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            "serving.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "30",
            "-extfile",
            "serving.ext",
            "-out",
            "serving.crt",
            cwd=d,
        )
        _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
        _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)
        # 1.20 still reads a static token file: token,user,uid,"groups"
        (d / "tokens.csv").write_text(f'{self.admin_token},{ADMIN},{ADMIN},"system:masters"\n')

    def _start_etcd(self) -> None:
        if self.etcd is not None and self.etcd.poll() is None:
            return
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        log = (self.base / "etcd.log").open("ab")
        self.etcd = subprocess.Popen(
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
                "--initial-cluster-state",
                "new",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()

        def healthy() -> bool:
            if self.etcd is not None and self.etcd.poll() is not None:
                raise RuntimeError(
                    f"etcd exited {self.etcd.returncode}:\n" f"{_tail(self.base / 'etcd.log')}"
                )
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=2) as r:
                    return bool(json.loads(r.read()).get("health") == "true")
            except (OSError, ValueError):
                return False

        wait_for(healthy, lambda: f"healthy etcd on {client}", timeout=15)

    def _apiserver_args(self) -> list[str]:
        d = self.base
        return [
            str(build.APISERVER),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",  # else it looks for a default route
            f"--secure-port={self.port}",
            "--insecure-port=0",  # 1.20 still has one; two labs would both want 8080
            f"--cert-dir={d}",
            f"--tls-cert-file={d / 'serving.crt'}",
            f"--tls-private-key-file={d / 'serving.key'}",
            f"--client-ca-file={d / 'ca.crt'}",
            f"--token-auth-file={d / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            # the TokenRequest API: all four are needed in 1.20
            f"--service-account-issuer={ISSUER}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            f"--service-account-key-file={d / 'sa.pub'}",
            f"--api-audiences={ISSUER}",
            # no controller-manager, so no token controller to give the plugin its secrets
            "--disable-admission-plugins=ServiceAccount",
            "--service-cluster-ip-range=10.96.0.0/12",
            "--endpoint-reconciler-type=none",  # loopback Endpoints would fail validation
            "--allow-privileged=true",  # the agent's DaemonSet runs privileged
            "--profiling=false",
            *self.extra_args,
        ]

    # -- life cycle --------------------------------------------------------------------

    def start(self) -> KubeApiServer:
        """Start etcd (unless running) and the API server; return when /readyz says ok."""
        self._start_etcd()
        if self.proc is not None and self.proc.poll() is None:
            return self
        log = (self.base / "apiserver.log").open("ab")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            self._apiserver_args(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        log.close()

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"kube-apiserver exited {self.proc.returncode}:\n"
                    f"{_tail(self.base / 'apiserver.log')}"
                )
            try:
                return self.request("GET", "/readyz", timeout=2)[0] == 200
            except OSError:
                return False

        wait_for(
            ready,
            lambda: f"ready kube-apiserver on {self.url}:\n"
            f"{_tail(self.base / 'apiserver.log')}",
            timeout=30,
            every=0.2,
        )
        self.started_in = time.monotonic() - t0
        return self

    @staticmethod
    def _end(proc: subprocess.Popen[bytes] | None, sig: int) -> None:
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout=hang_guard(15))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop(self) -> None:
        """Stop the API server gracefully (SIGTERM); etcd and its data stay."""
        self._end(self.proc, signal.SIGTERM)

    def kill(self) -> None:
        """kill -9 the API server, for failure tests: connections drop, watches break."""
        self._end(self.proc, signal.SIGKILL)

    def destroy(self) -> None:
        self._end(self.proc, signal.SIGTERM)
        self._end(self.etcd, signal.SIGTERM)
        shutil.rmtree(self.base, ignore_errors=True)

    def compact(self) -> int:
        """Compact etcd (through its v3 HTTP gateway) so that no resourceVersion seen so far
        can start a watch or go on with a list (tests.k8slab.FakeApiServer.compact()'s
        promise): a watch from version v reads from v+1, so the compaction goes two revisions
        past the latest (two writes of a key outside the API server's /registry). Only a
        server started with --watch-cache=false answers such a watch with 410 at once: the
        watch cache serves its own window of recent events. The revision compacted at."""
        etcd = f"http://127.0.0.1:{self.etcd_port}/v3/kv"

        def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            req = urllib.request.Request(
                f"{etcd}/{path}", data=json.dumps(body).encode(), method="POST"
            )
            with urllib.request.urlopen(req, timeout=hang_guard(10)) as r:
                got: dict[str, Any] = json.loads(r.read())
                return got

        def b64(text: str) -> str:
            return base64.b64encode(text.encode()).decode()

        for _ in range(2):
            got = post("put", {"key": b64("/lens-lab/compaction"), "value": b64("bump")})
        rev = int(got["header"]["revision"])
        post("compaction", {"revision": str(rev), "physical": True})
        return rev

    def __enter__(self) -> KubeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    # -- clients -----------------------------------------------------------------------

    def write_kubeconfig(
        self, path: Path, user: str, token: str, namespace: str = "default"
    ) -> Path:
        """A self-contained kubeconfig (the CA inline, a bearer token) for this server."""
        ca = base64.b64encode(self.ca.read_bytes()).decode()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "lab", "cluster": {"server": self.url, "certificate-authority-data": ca}}
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [
                {"name": "lab", "context": {"cluster": "lab", "user": user, "namespace": namespace}}
            ],
            "current-context": "lab",
        }
        path.write_text(json.dumps(config, indent=1) + "\n")  # JSON is YAML to kubectl
        path.chmod(0o600)
        return path

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """The cached kubectl 1.20.2 as the admin (or with `kubeconfig`); KubectlError
        with its stderr when it fails and `check`."""
        cmd = [
            str(build.KUBECTL),
            f"--kubeconfig={kubeconfig or self.admin_kubeconfig}",
            f"--cache-dir={self.base / 'kubectl-cache'}",
            *args,
        ]
        r = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=hang_guard(30))
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
        """One API request (the admin's unless `token`): api_request()'s answer."""
        return api_request(
            self.url, self._ssl, token or self.admin_token, method, path, body, timeout
        )

    def _ensure(self, path: str, body: dict[str, Any]) -> None:
        status, got = self.request("POST", path, body)
        if status not in (201, 409):  # 409: it exists
            raise RuntimeError(f"POST {path}: {status} {got}")

    def token_for(
        self,
        namespace: str,
        serviceaccount: str,
        audiences: list[str] | None = None,
        seconds: int = 3600,
    ) -> str:
        """A bound ServiceAccount token from the TokenRequest API (the namespace and the
        ServiceAccount are created when missing). It carries the SA's groups only:
        system:serviceaccounts[:<namespace>] and system:authenticated."""
        self._ensure("/api/v1/namespaces", {"metadata": {"name": namespace}})
        sas = f"/api/v1/namespaces/{namespace}/serviceaccounts"
        self._ensure(sas, {"metadata": {"name": serviceaccount}})
        spec = {"audiences": audiences or [ISSUER], "expirationSeconds": seconds}
        status, got = self.request(
            "POST",
            f"{sas}/{serviceaccount}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        if status != 201:
            raise RuntimeError(f"TokenRequest for {namespace}/{serviceaccount}: {status} {got}")
        return str(got["status"]["token"])

    def kubeconfig_for(self, namespace: str, serviceaccount: str, path: Path) -> Path:
        """A kubeconfig that acts as namespace/serviceaccount (a token_for() token)."""
        token = self.token_for(namespace, serviceaccount)
        user = f"system:serviceaccount:{namespace}:{serviceaccount}"
        return self.write_kubeconfig(path, user, token, namespace=namespace)
