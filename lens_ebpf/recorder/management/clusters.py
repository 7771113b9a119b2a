"""The Cluster Management page's clusters: the ones the service follows (clusters.py), each
as ClusterConfigResponse; one added from a kubeconfig (or the page's endpoint, CA and
token or client certificate, made into one) is checked (a kubeconfig a client can be
made of, an API that answers) and then kept as the multi-cluster Secret keeps them (a
key per cluster: its kubeconfig), never echoed back; removed from the Secret again (its
watches stop, its finalizers come off); the default one (the cluster a question naming
none is about); a connection test; and "initialize": the agent's objects installed there
as a task (tasks.py) whose logs the page tails."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import yaml
from sqlalchemy import Connection, delete, select, update

from lens_ebpf.k8s.reflector import call_raw, describe
from lens_ebpf.recorder.alerts.model import when
from lens_ebpf.recorder.config import CLUSTER_NAME
from lens_ebpf.recorder.errors import BadRequest, Conflict, Forbidden, NotFound, Unavailable
from lens_ebpf.recorder.management.manifest import RawApi
from lens_ebpf.recorder.store import schema as t
from lens_ebpf.recorder.store.writer import redact
from lens_ebpf.recorder.tracker.clusters import Clusters, client_from_kubeconfig

MC = t.managed_clusters
TASKS = t.cluster_tasks
ACTIVE = ("pending", "running")
INFRA = {
    "pending": "initializing",
    "running": "initializing",
    "completed": "ready",
    "failed": "failed",
}
TEXT_FIELDS = ("display_name", "description")


def empty_row(name: str, now: datetime, who: str = "") -> dict[str, Any]:
    return {
        "cluster_name": name,
        "display_name": "",
        "description": "",
        "labels": {},
        "is_default": False,
        "release_version_id": None,
        "values_override": {},
        "deployed_version_id": None,
        "deployed_values": {},
        "deployed_at": None,
        "created_by": who,
        "created_at": now,
        "updated_at": now,
    }


def ensure_row(conn: Connection, name: str, now: datetime, who: str = "") -> Any:
    """The cluster's managed_clusters row, made when it has none yet."""
    r = conn.execute(select(MC).where(MC.c.cluster_name == name)).first()
    if r is None:
        conn.execute(MC.insert(), empty_row(name, now, who))
        r = conn.execute(select(MC).where(MC.c.cluster_name == name)).first()
    return r


def _b64(text: str) -> str:
    """Base64 data as a kubeconfig holds it: given already encoded, or PEM encoded here."""
    s = text.strip()
    if s.startswith("-----BEGIN"):
        return base64.b64encode(s.encode() + b"\n").decode()
    try:
        base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest("k8s_ca_data, k8s_cert_data, k8s_key_data: base64 or PEM") from None
    return s


def kubeconfig_of(name: str, body: dict[str, Any]) -> str | None:
    """The kubeconfig a request gives: `kubeconfig` (its text, or base64 of it), or the
    page's k8s_endpoint with k8s_ca_data and k8s_token or k8s_cert_data + k8s_key_data
    made into one; None when it gives neither."""
    raw = body.get("kubeconfig")
    if raw is not None:
        if not isinstance(raw, str) or not raw.strip():
            raise BadRequest("kubeconfig: the kubeconfig's text (YAML or JSON) is required")
        text = raw
        if not re.search(r"[:{]", raw):  # no YAML or JSON in it: base64 of a kubeconfig
            try:
                text = base64.b64decode(raw, validate=True).decode()
            except (binascii.Error, ValueError, UnicodeDecodeError):
                raise BadRequest("kubeconfig: neither a kubeconfig nor base64 of one") from None
        return text
    endpoint = str(body.get("k8s_endpoint") or "").strip()
    if not endpoint:
        return None
    if urlsplit(endpoint).scheme not in ("https", "http") or not urlsplit(endpoint).hostname:
        raise BadRequest(f"k8s_endpoint={endpoint!r}: an https:// address of the API server")
    cluster: dict[str, Any] = {"server": endpoint}
    if body.get("k8s_ca_data"):
        cluster["certificate-authority-data"] = _b64(str(body["k8s_ca_data"]))
    if body.get("k8s_insecure_skip_verify"):
        cluster["insecure-skip-tls-verify"] = True
    user: dict[str, Any] = {}
    if body.get("k8s_token"):
        user["token"] = str(body["k8s_token"]).strip()
    elif body.get("k8s_cert_data") and body.get("k8s_key_data"):
        user["client-certificate-data"] = _b64(str(body["k8s_cert_data"]))
        user["client-key-data"] = _b64(str(body["k8s_key_data"]))
    else:
        raise BadRequest(
            "k8s_token, or k8s_cert_data and k8s_key_data: how to authenticate "
            "to the cluster's API"
        )
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": name,
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
    }
    return yaml.safe_dump(doc, sort_keys=False)


def server_of(client: Any) -> str:
    cfg = getattr(client, "configuration", None)
    return str(getattr(cfg, "host", "") or "")


class ClusterAdmin:
    """The clusters as the Management page manages them."""

    def __init__(
        self,
        clusters: Clusters,
        timeout: float,
        database_url: str,
        scanned: Callable[[Connection, str], dict[str, Any]] | None = None,
    ) -> None:
        self.clusters, self.timeout = clusters, timeout
        self.database_url = redact(database_url)
        self.scanned = scanned or (lambda conn, name: {})
        cfg = clusters.shared.cfg
        self.secret, self.namespace = cfg.multicluster.secret, clusters.namespace

    # -- the default ------------------------------------------------------------------------
    def load_default(self, conn: Connection) -> str:
        """The default the database holds, applied here (every replica reads it)."""
        got = conn.execute(select(MC.c.cluster_name).where(MC.c.is_default)).scalar()
        self.clusters.default = str(got or "")
        return self.clusters.default

    def set_default(self, conn: Connection, name: str, now: datetime) -> dict[str, Any]:
        self._known(name)
        ensure_row(conn, name, now)
        conn.execute(
            update(MC)
            .where(MC.c.cluster_name != name, MC.c.is_default)
            .values(is_default=False, updated_at=now)
        )
        conn.execute(
            update(MC).where(MC.c.cluster_name == name).values(is_default=True, updated_at=now)
        )
        self.clusters.default = name
        return {"message": "Default cluster set successfully", "cluster_name": name}

    def clear_default(self, conn: Connection, now: datetime) -> dict[str, Any]:
        got = conn.execute(
            update(MC).where(MC.c.is_default).values(is_default=False, updated_at=now)
        )
        self.clusters.default = ""
        return {
            "message": "default cluster cleared" if got.rowcount else "no default cluster to clear"
        }

    def default_name(self) -> str:
        """The default cluster (the home one unless one is set)."""
        d = self.clusters.default
        return d if d and self.clusters.get(d) is not None else self.clusters.home_name

    # -- reading ----------------------------------------------------------------------------
    def _known(self, name: str) -> Any:
        w = self.clusters.get(name)
        if w is None:
            known = ", ".join(self.clusters.names())
            raise NotFound(f"Cluster not found: {name!r} (known: {known})")
        return w

    def listing(self, conn: Connection) -> list[dict[str, Any]]:
        rows = {r.cluster_name: r for r in conn.execute(select(MC))}
        names = sorted(self.clusters.names(), key=lambda n: (n != self.clusters.home_name, n))
        return [self.config_json(conn, i + 1, n, rows.get(n)) for i, n in enumerate(names)]

    def get(self, conn: Connection, name: str) -> dict[str, Any]:
        self._known(name)
        for item in self.listing(conn):
            if item["cluster_name"] == name:
                return item
        raise NotFound(f"Cluster not found: {name!r}")  # pragma: no cover - listed above

    def latest_task(self, conn: Connection, name: str, scope: str = "") -> Any:
        q = select(TASKS).where(TASKS.c.cluster_name == name)
        if scope:
            q = q.where(TASKS.c.install_scope == scope)
        return conn.execute(q.order_by(TASKS.c.id.desc()).limit(1)).first()

    def config_json(self, conn: Connection, ident: int, name: str, row: Any) -> dict[str, Any]:
        """ClusterConfigResponse: what this service knows of the cluster (no secrets: the
        kubeconfig stays in the Secret), storage as the service's own (its database, its
        Prometheus, its remote write)."""
        w = self.clusters.get(name)
        home = name == self.clusters.home_name
        client = getattr(w, "client", None)
        server = server_of(client) if client is not None else ""
        prom = urlsplit(w.prom.url if w is not None else "")
        db = urlsplit(self.database_url.replace("+psycopg", ""))
        task = self.latest_task(conn, name, "infrastructure")
        scan = self.scanned(conn, name)
        infra = (
            INFRA.get(task.status, "not_initialized")
            if task is not None
            else ("ready" if scan.get("image") else "not_initialized")
        )
        up = bool(w is not None and w.up)
        made = row.created_at if row is not None else None
        skip = bool(getattr(getattr(client, "configuration", None), "verify_ssl", True) is False)
        return {
            "id": ident,
            "cluster_name": name,
            "display_name": (row.display_name if row is not None else "") or name,
            "description": row.description if row is not None else "",
            "source": w.source.origin if w is not None else "secret",
            "k8s_endpoint": server,
            "k8s_configured": client is not None,
            "k8s_insecure_skip_verify": skip,
            "k8s_manual_mode": not home,
            "postgres_host": db.hostname or "" if db.scheme.startswith("postgres") else "",
            "postgres_port": (db.port or 5432) if db.scheme.startswith("postgres") else 0,
            "postgres_configured": db.scheme.startswith("postgres"),
            "opensearch_host": "",
            "opensearch_port": 0,
            "opensearch_scheme": "",
            "opensearch_configured": False,
            "prometheus_read_host": prom.hostname or "",
            "prometheus_read_port": prom.port or 0,
            "prometheus_write_host": "",
            "prometheus_write_port": 0,
            "prometheus_configured": bool(prom.hostname),
            "storage_manual_mode": False,
            "storage_mode": "external",
            "infrastructure_status": infra,
            "infrastructure_message": (task.error_message or task.current_stage)
            if task is not None
            else "",
            "dataplane_status": "deployed" if scan.get("image") else "pending",
            "dataplane_version": scan.get("version", ""),
            "dataplane_message": scan.get("error", "") or scan.get("image", ""),
            "last_deploy_time": when(row.deployed_at) or "" if row is not None else "",
            "status": "active" if up else "down",
            "is_default": name == self.default_name(),
            "labels": dict(row.labels or {}) if row is not None else {},
            "created_at": when(made) or "",
            "updated_at": when(row.updated_at) or "" if row is not None else "",
            # lens-ebpf's: whether its watches run and answer, why not
            "up": up,
            "error": (w.state().get("error", "") if w is not None else ""),
            "home": home,
        }

    # -- the Secret ---------------------------------------------------------------------------
    def _need_secret(self) -> None:
        if not self.secret:
            raise Forbidden(
                "clusters are added to the multi-cluster Secret, and "
                "multicluster.secret is not set (deploy/recorder sets it to "
                "multi-k8s-config)"
            )

    def _edit_secret(self, change: Callable[[dict[str, str]], object]) -> None:
        """The multi-cluster Secret read, changed and written back (made when missing; a
        concurrent change is a 409 to retry)."""
        core = self.clusters.home.api.core
        try:
            cur: dict[str, Any] | None = call_raw(
                core.read_namespaced_secret, self.secret, self.namespace, timeout=self.timeout
            )
        except Exception as exc:
            if getattr(exc, "status", None) != 404:
                raise Unavailable(
                    f"the multi-cluster Secret {self.namespace}/{self.secret}: " f"{describe(exc)}"
                ) from None
            cur = None
        data = dict((cur or {}).get("data") or {})
        change(data)
        try:
            if cur is None:
                body = {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "type": "Opaque",
                    "data": data,
                    "metadata": {"name": self.secret, "namespace": self.namespace},
                }
                call_raw(core.create_namespaced_secret, self.namespace, body, timeout=self.timeout)
            else:
                cur["data"] = data
                call_raw(
                    core.replace_namespaced_secret,
                    self.secret,
                    self.namespace,
                    cur,
                    timeout=self.timeout,
                )
        except Exception as exc:
            if getattr(exc, "status", None) == 409:
                raise Conflict(
                    f"the multi-cluster Secret {self.secret} changed meanwhile; " "try again"
                ) from None
            raise Unavailable(
                f"the multi-cluster Secret {self.namespace}/{self.secret} could "
                f"not be written: {describe(exc)}"
            ) from None

    def checked(self, name: str, text: str) -> str:
        """The kubeconfig when a client can be made of it and its API answers (BadRequest
        saying why not); the API server's version."""
        try:
            client = client_from_kubeconfig(text)
        except ValueError as exc:
            raise BadRequest(f"cluster {name}: {exc}") from None
        server = server_of(client)
        try:
            return RawApi(client, min(self.timeout, 10.0)).version()
        except Exception as exc:
            raise BadRequest(
                f"cluster {name}: its API at {server} does not answer: " f"{describe(exc)}"
            ) from None
        finally:
            client.close()

    # -- writes -------------------------------------------------------------------------------
    def add(
        self, conn: Connection, body: dict[str, Any], now: datetime, who: str
    ) -> dict[str, Any]:
        """A cluster the Secret holds from now on (201's body: its ClusterConfigResponse)."""
        name = str(body.get("cluster_name") or "").strip()
        if not re.match(CLUSTER_NAME, name):
            raise BadRequest(
                f"cluster_name={name!r}: lowercase letters, digits and '-' (a " "DNS label)"
            )
        if (
            self.clusters.get(name) is not None
            or conn.execute(select(MC.c.cluster_name).where(MC.c.cluster_name == name)).first()
        ):
            raise Conflict(f"Cluster already exists: {name}")
        self._need_secret()
        text = kubeconfig_of(name, body)
        if text is None:
            raise BadRequest(
                "kubeconfig (its text), or k8s_endpoint with k8s_token or a "
                "client certificate, is required"
            )
        self.checked(name, text)
        row = empty_row(name, now, who) | self._fields(body)
        conn.execute(MC.insert(), row)
        encoded = base64.b64encode(text.encode()).decode()
        self._edit_secret(lambda data: data.__setitem__(name, encoded))
        self.clusters.reload()
        return self.get(conn, name)

    @staticmethod
    def _fields(body: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in TEXT_FIELDS:
            if body.get(k) is not None:
                if not isinstance(body[k], str):
                    raise BadRequest(f"{k}: a string is required")
                out[k] = body[k][:2000]
        labels = body.get("labels")
        if labels is not None:
            if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
                raise BadRequest("labels: an object of strings is required")
            out["labels"] = labels
        return out

    def change(
        self, conn: Connection, name: str, body: dict[str, Any], now: datetime
    ) -> dict[str, Any]:
        """Its names and labels; a new kubeconfig (checked as when added) for a cluster the
        Secret holds."""
        w = self._known(name)
        ensure_row(conn, name, now)
        fields = self._fields(body)
        if fields:
            conn.execute(
                update(MC).where(MC.c.cluster_name == name).values(updated_at=now, **fields)
            )
        text = kubeconfig_of(name, body)
        if text is not None:
            if w.source.origin != "secret":
                raise Forbidden(
                    f"cluster {name} is reached through the service's settings "
                    f"({w.source.origin}), not the multi-cluster Secret"
                )
            self.checked(name, text)
            encoded = base64.b64encode(text.encode()).decode()
            self._edit_secret(lambda data: data.__setitem__(name, encoded))
            self.clusters.reload()
        return self.get(conn, name)

    def remove(self, conn: Connection, name: str) -> dict[str, Any]:
        """Out of the Secret: its watches stop, its finalizers come off."""
        w = self._known(name)
        if w.source.origin != "secret":
            why = (
                "the home cluster"
                if w.source.origin == "home"
                else "listed in the service's clusters: setting"
            )
            raise Forbidden(
                f"cluster {name} is {why}; only clusters of the multi-cluster "
                "Secret are removed here"
            )
        self._edit_secret(lambda data: data.pop(name, None))
        conn.execute(delete(MC).where(MC.c.cluster_name == name))
        if self.clusters.default == name:
            self.clusters.default = ""
        self.clusters.reload()
        return {"message": "Cluster deleted successfully", "cluster_name": name}

    def test(self, name: str, database_up: bool) -> dict[str, Any]:
        """TestClusterConnection: the API's version, or why it does not answer."""
        w = self._known(name)
        out: dict[str, Any] = {
            "cluster_name": name,
            "k8s_connected": False,
            "storage_connected": database_up,
        }
        if w.client is None:
            return out | {"error": w.error or "no API client", "k8s_error": w.error}
        try:
            out |= {
                "k8s_connected": True,
                "k8s_version": RawApi(w.client, min(self.timeout, 10.0)).version(),
            }
        except Exception as exc:
            out["k8s_error"] = describe(exc)
        return out
