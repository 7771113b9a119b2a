"""A Kubernetes API client for either service: in-cluster, or from a kubeconfig, and the
settings that choose it (the `kubernetes:` section both services share)."""

from __future__ import annotations

import logging
import os
import re
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from lens_ebpf.core.settings import Section

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
log = logging.getLogger(__name__)
_unverified: set[str] = set()  # APIs said once to be reached without TLS verification


def own_namespace(sa_dir: Path = SA_DIR) -> str:
    """The namespace this process runs in: POD_NAMESPACE, its service account's, else
    default."""
    ns = os.environ.get("POD_NAMESPACE", "")
    if not ns and (sa_dir / "namespace").exists():
        ns = (sa_dir / "namespace").read_text().strip()
    return ns or "default"


class NotConfiguredError(Exception):
    """No API to talk to: standalone mode (the message says why)."""


def api_client(mode: str, kubeconfig: str, sa_dir: Path = SA_DIR) -> Any:
    """A kubernetes ApiClient for in-cluster or kubeconfig access.

    mode auto tries in-cluster (the service account is mounted and
    KUBERNETES_SERVICE_HOST is set), then kubeconfig (the key, or $KUBECONFIG).
    """
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and (sa_dir / "token").exists()
    path = kubeconfig or os.environ.get("KUBECONFIG", "")
    if mode == "off":
        raise NotConfiguredError("kubernetes.mode is off")
    if not (mode in ("auto", "in-cluster") and in_cluster) and not (
        mode in ("auto", "kubeconfig") and path
    ):
        if mode == "in-cluster":
            raise ValueError("kubernetes.mode is in-cluster but no service account is mounted")
        if mode == "kubeconfig":
            raise ValueError("kubernetes.mode is kubeconfig but no kubeconfig is set")
        # decided before the client library is imported: standalone needs none
        raise NotConfiguredError("no in-cluster account and no kubeconfig: standalone")
    from kubernetes import client, config

    conf = client.Configuration()
    if mode in ("auto", "in-cluster") and in_cluster:
        config.load_incluster_config(client_configuration=conf)
    elif mode in ("auto", "kubeconfig") and path:
        try:
            config.load_kube_config(config_file=path, client_configuration=conf)
        except Exception as exc:  # missing file, bad YAML, no current context
            raise ValueError(f"kubeconfig {path}: {exc}") from None
    if not conf.verify_ssl:
        unverified(conf.host)
    return client.ApiClient(conf)


def unverified(url: str) -> None:
    """An API reached without TLS verification (a kubeconfig's insecure-skip-tls-verify):
    said once here, not by urllib3 on every request (it warns each time: its
    SecurityWarnings are "always")."""
    host = urlsplit(url).hostname or url
    from urllib3.exceptions import InsecureRequestWarning

    warnings.filterwarnings(
        "ignore",
        f"Unverified HTTPS request is being made to host " f"'{re.escape(host)}'",
        InsecureRequestWarning,
    )
    if url not in _unverified:
        _unverified.add(url)
        log.warning(
            "kubernetes API %s: its certificate is not verified " "(insecure-skip-tls-verify)", url
        )


class KubernetesClientConfig(Section):
    mode: str = "auto"
    kubeconfig: str = ""
    request_timeout_seconds: float = Field(10.0, gt=0)
    watch_timeout_seconds: float = Field(300.0, ge=1)
    backoff_max_seconds: float = Field(30.0, gt=0)

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_off(cls, v: Any) -> Any:
        return "off" if v is False else v  # YAML 1.1 reads a bare off as false

    @field_validator("mode")
    @classmethod
    def _mode(cls, v: str) -> str:
        if v not in ("auto", "in-cluster", "kubeconfig", "off"):
            raise ValueError("must be one of auto, in-cluster, kubeconfig, off")
        return v
