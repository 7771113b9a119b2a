"""The recorder as replicas run it: `lens-ebpf recorder` processes with one shared
PostgreSQL, leader election on, each acting as the ServiceAccount deploy/recorder names
(a kubeconfig of its token), on ports of their own; started, asked, killed -9."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import requests
import yaml

from tests.agentproc import LENS_CMD, free_port, parse_samples, wait_http_ok
from tests.conftest import hang_guard

NAMESPACE = "lens-ebpf"  # deploy/recorder's


class Replica:
    def __init__(
        self,
        identity: str,
        database_url: str,
        kubeconfig: Path,
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.identity = identity
        self.dir = Path(tempfile.mkdtemp(prefix=f"lens-{identity}-"))
        self.port, self.collect_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        recorder: dict[str, Any] = {
            "database_url": database_url,
            "listen": f"127.0.0.1:{self.port}",
            "collect_listen": f"127.0.0.1:{self.collect_port}",
            "db_retry_max_seconds": 0.5,
            "reports": {"weekly": False},
            "leader_election": {
                "enabled": True,
                "namespace": NAMESPACE,
                "identity": identity,
                "advertise": f"127.0.0.1:{self.port}",
            },
        }
        for key, value in (settings or {}).items():
            node: dict[str, Any] = recorder
            *parents, last = key.split("__")
            for p in parents:
                node = node.setdefault(p, {})
            node[last] = value
        cfg = {
            "log_level": "info",
            "recorder": recorder,
            "kubernetes": {
                "mode": "kubeconfig",
                "kubeconfig": str(kubeconfig),
                "backoff_max_seconds": 1,
            },
        }
        self.config = self.dir / "recorder.yaml"
        self.config.write_text(yaml.safe_dump(cfg))
        self.log = self.dir / "log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Replica:
        out = self.log.open("ab")
        env = {**os.environ, "POD_NAME": self.identity, "POD_NAMESPACE": NAMESPACE}
        env.pop("KUBECONFIG", None)
        self.proc = subprocess.Popen(
            [*LENS_CMD, "recorder", "--config", str(self.config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        out.close()
        wait_http_ok(f"{self.url}/healthz", self.proc, self.identity, self.output, timeout=30)
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9: no flush, no release of the Lease."""
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(hang_guard(15))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    # -- asking it -----------------------------------------------------------------------
    def readyz(self) -> dict[str, Any]:
        r = requests.get(f"{self.url}/readyz", timeout=hang_guard(5))
        body: dict[str, Any] = r.json()
        return body

    def leader_state(self) -> dict[str, Any] | None:
        """/readyz's leader part; None when it does not answer."""
        try:
            return dict(self.readyz().get("leader") or {})
        except (requests.RequestException, ValueError):
            return None

    def leads(self) -> bool:
        got = self.leader_state()
        return bool(got and got.get("leading"))

    def metrics(self) -> list[tuple[str, dict[str, str], float]]:
        r = requests.get(f"{self.url}/metrics", timeout=hang_guard(5))
        return parse_samples(r.text)

    def metric(self, name: str, **labels: str) -> float:
        got = [
            v
            for n, lbl, v in self.metrics()
            if n == name and all(lbl.get(k) == w for k, w in labels.items())
        ]
        return sum(got)


def apply(lab: Any, *manifests: Path) -> None:
    """kubectl apply of deploy/ manifests as the admin (their RBAC as shipped)."""
    for path in manifests:
        lab.kubectl("apply", "-f", str(path))


def errors_in(log: str) -> list[str]:
    """Tracebacks and ERROR lines of a replica's log."""
    return [line for line in log.splitlines() if re.search(r"Traceback|\bERROR\b", line)]


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)
