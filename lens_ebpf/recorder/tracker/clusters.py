"""The clusters the service follows: the home one (kubernetes.*), those in `clusters:` and
those of the seed's multi-k8s-config Secret (one key per cluster, its kubeconfig), read
again every multicluster.reload_seconds: a cluster added starts its watches, a removed one
stops them, a changed kubeconfig restarts them. A cluster whose kubeconfig is broken or
whose API does not answer is down (lens_recorder_cluster_up, /readyz's body, GET
/api/clusters) while the others go on.

Each cluster has its own watches (GPU pods and their workloads, with its own finalizers;
nodes) and its own storage scan; its rows carry its name. The storage config exporter
(multicluster.storage_config_sync) merges every cluster's storage-config Secret into the
home cluster's multi-storage-config: one key per cluster holding the JSON of that
Secret's data (as the seed's exporter writes it), written only when it changed, and not at
all while a cluster cannot be read (never a Secret with a cluster missing by accident).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine

from lens_ebpf.core.exposition import counter, gauge
from lens_ebpf.core.runner import Runner
from lens_ebpf.k8s.client import SA_DIR
from lens_ebpf.k8s.dynamic import DynamicApi
from lens_ebpf.k8s.reflector import call_raw
from lens_ebpf.recorder.config import CLUSTER_NAME, Config
from lens_ebpf.recorder.errors import NotFound
from lens_ebpf.recorder.jobs import leader_job
from lens_ebpf.recorder.nodes import NodeTracker
from lens_ebpf.recorder.prom import Prom
from lens_ebpf.recorder.scope import Scope
from lens_ebpf.recorder.storage import StorageScan
from lens_ebpf.recorder.store.writer import Writer
from lens_ebpf.recorder.tracker import WorkloadTracker

log = logging.getLogger(__name__)
SA_NAMESPACE = SA_DIR / "namespace"


def own_namespace(sa_file: Path = SA_NAMESPACE) -> str:
    """The namespace the service runs in: POD_NAMESPACE, its service account's, else
    default."""
    ns = os.environ.get("POD_NAMESPACE", "")
    if not ns and sa_file.exists():
        ns = sa_file.read_text().strip()
    return ns or "default"


def client_from_kubeconfig(text: str) -> Any:
    """An ApiClient from a kubeconfig's text; ValueError saying why it cannot be used."""
    from kubernetes import client, config

    try:
        doc = yaml.safe_load(text)
        if not isinstance(doc, dict):
            raise ValueError("not a kubeconfig (no mapping)")
        conf = client.Configuration()
        config.load_kube_config_from_dict(doc, client_configuration=conf)
    except Exception as exc:  # bad YAML, no current context, no cluster entry
        raise ValueError(f"kubeconfig: {type(exc).__name__}: {exc}"[:300]) from None
    return client.ApiClient(conf)


def read_clusters_secret(home: DynamicApi, cfg: Config, namespace: str = "") -> dict[str, str]:
    """cluster name -> its kubeconfig, from multicluster.secret's keys (a key that is not
    a cluster name or not base64 is an error naming it)."""
    name, ns = cfg.multicluster.secret, namespace or cfg.multicluster.namespace or own_namespace()
    doc = call_raw(
        home.core.read_namespaced_secret, name, ns, timeout=cfg.kubernetes.request_timeout_seconds
    )
    out = {}
    for key, value in sorted((doc.get("data") or {}).items()):
        if not re.match(CLUSTER_NAME, key):
            raise ValueError(
                f"secret {ns}/{name}: key {key!r} is not a cluster name " "(a DNS label)"
            )
        try:
            out[key] = base64.b64decode(str(value), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise ValueError(
                f"secret {ns}/{name}: key {key!r} is not base64 of a " "kubeconfig"
            ) from None
    return out


@dataclass(frozen=True)
class Source:
    """Where a cluster's API client comes from: a file or in-cluster (config), a Secret's
    key (its bytes: a change restarts the cluster), or the home client."""

    origin: str  # home, config, secret
    kubeconfig: str = ""  # a path, or in-cluster (config)
    text: str = ""  # the kubeconfig itself (secret)
    prometheus_url: str = ""

    def client(self) -> Any:
        if self.origin == "secret":
            return client_from_kubeconfig(self.text)
        from lens_ebpf.k8s.client import api_client

        mode = "in-cluster" if self.kubeconfig == "in-cluster" else "kubeconfig"
        return api_client(mode, "" if mode == "in-cluster" else self.kubeconfig)


@dataclass
class Shared:
    """What every cluster's parts are built with."""

    cfg: Config
    engine: Engine
    writer: Writer
    prom: Prom  # recorder.prometheus
    clock: Callable[[], datetime]
    runner: Runner = field(default_factory=Runner)  # the service's: each cluster's scan


class ClusterWatch:
    """One cluster: its API client, its watches and its storage scan."""

    def __init__(self, name: str, source: Source, shared: Shared, client: Any = None) -> None:
        self.name, self.source, self.shared = name, source, shared
        self.error = ""  # why it is not watched (a broken kubeconfig)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.tracker: WorkloadTracker | None = None
        self.nodes: NodeTracker | None = None
        self.storage: StorageScan | None = None
        cfg = shared.cfg
        r, k = cfg.recorder, cfg.kubernetes
        url = source.prometheus_url
        p = r.prometheus
        self.prom = Prom(url, p.timeout_seconds, p.max_points) if url else shared.prom
        try:
            self.client = client if client is not None else source.client()
        except Exception as exc:  # a broken kubeconfig; NotConfiguredError (no service account)
            # ValueError and OSError say what they are themselves
            said = isinstance(exc, ValueError | OSError)
            self.error = (str(exc) if said else f"{type(exc).__name__}: {exc}")[:300]
            self.client = None
            log.warning("recorder: cluster %s: %s", name, self.error)
            return
        self.api = DynamicApi(self.client, k.request_timeout_seconds)
        opts = {
            "request_timeout": k.request_timeout_seconds,
            "watch_timeout": k.watch_timeout_seconds,
            "backoff_max": k.backoff_max_seconds,
        }
        self.tracker = WorkloadTracker(
            self.api,
            shared.writer,
            r.gpu_resources,
            finalizers=r.finalizers,
            reflector_opts=opts,
            clock=shared.clock,
            cluster=name,
        )
        self.nodes = NodeTracker(
            self.api.core.list_node,
            shared.writer,
            r.gpu_resources,
            shared.clock,
            cluster=name,
            **opts,
        )
        self.storage = StorageScan(
            self.client, k.request_timeout_seconds, self.prom, r.storage, shared.clock
        )

    def recover(self) -> None:
        if self.tracker is not None:
            with self.shared.engine.connect() as conn:
                self.tracker.recover(conn)

    def start(self) -> None:
        if self.tracker is None or self.nodes is None or self.storage is None:
            return
        self.tracker.start()
        th = threading.Thread(
            target=self.nodes.reflector.run,
            args=(self._stop,),
            daemon=True,
            name=f"recorder-{self.name}-nodes",
        )
        th.start()
        self._threads.append(th)
        scan = self.storage
        every = scan.cfg.scan_seconds
        self.shared.runner.add(
            leader_job(
                self.scan_job, every, lambda: scan.run_once(scan.clock()), at_start=True, quiet=()
            )
        )

    @property
    def scan_job(self) -> str:
        return f"storage_scan/{self.name}"

    def stop(self) -> None:
        self._stop.set()
        self.shared.runner.remove(self.scan_job)
        if self.tracker is not None:
            self.tracker.stop()
        if self.nodes is not None:
            self.nodes.reflector.stop()
        for th in self._threads:
            th.join(timeout=3)

    def release(self) -> int:
        """Take the recorder's finalizer off the workloads it follows here (the cluster is
        no longer followed: nothing would take it off later); the removals. Call after
        stop()."""
        return self.tracker.release_finalizers() if self.tracker is not None else 0

    @property
    def up(self) -> bool:
        """Watched, and its pod watch has listed and is connected."""
        r = self.tracker
        return r is not None and r.pod_reflector.synced.is_set() and r.pod_reflector.connected

    def state(self) -> dict[str, Any]:
        why = self.error or ("" if self.up else "its API is not answering (yet)")
        return {"name": self.name, "source": self.source.origin, "up": self.up, "error": why}

    def scope(self) -> Scope:
        return Scope(self.name, self.prom, self.storage.totals if self.storage else None)


class Clusters(Collector):
    """Every cluster the service follows, by name; the home one first."""

    def __init__(self, shared: Shared, home_client: Any) -> None:
        self.shared = shared
        cfg = shared.cfg
        self.home_name = cfg.recorder.cluster_name
        mc = cfg.multicluster
        self.namespace = mc.namespace or own_namespace()
        self._lock = threading.Lock()
        self.reloads: dict[str, int] = {"ok": 0, "unchanged": 0, "error": 0}
        self.reload_error = ""
        self.released: dict[str, int] = {}  # cluster -> finalizers taken off when it went
        self.watching = False  # the clusters' watches run here (alone, or the leader)
        self.default = ""  # the cluster a question naming none is about; "": the home one
        home = ClusterWatch(self.home_name, Source("home"), shared, home_client)
        self.home = home
        self.watches: dict[str, ClusterWatch] = {self.home_name: home}
        for name, entry in sorted(cfg.clusters.items()):
            if name == self.home_name:
                raise ValueError(
                    f"clusters.{name}: the home cluster (recorder.cluster_name) "
                    "is reached through kubernetes.*, not listed here"
                )
            self.watches[name] = ClusterWatch(
                name,
                Source("config", entry.kubeconfig, prometheus_url=entry.prometheus_url),
                shared,
            )

    # -- lifecycle -------------------------------------------------------------------
    def recover(self) -> None:
        for w in self.all():
            w.recover()

    def start(self, watch: bool = True) -> None:
        """Read the multi-k8s-config Secret once (its reload is a job of the service's
        runner) and, unless watch is False (a replica that does not lead), start each
        cluster's watches."""
        if watch:
            self.watch()
        if self.shared.cfg.multicluster.secret:
            self.reload()

    def watch(self) -> None:
        """Start every cluster's watches (and those of clusters added later)."""
        self.watching = True
        for w in self.all():
            w.start()

    def stop(self) -> None:
        self.watching = False
        for w in self.all():
            w.stop()

    def all(self) -> list[ClusterWatch]:
        with self._lock:
            return list(self.watches.values())

    def get(self, name: str) -> ClusterWatch | None:
        with self._lock:
            return self.watches.get(name)

    # -- the multi-k8s-config Secret -------------------------------------------------
    def read_secret(self) -> dict[str, str]:
        return read_clusters_secret(self.home.api, self.shared.cfg, self.namespace)

    def reload(self) -> bool:
        """Read the Secret and follow what it says now; False when it could not be read
        (the clusters stay as they were)."""
        try:
            wanted = self.read_secret()
        except Exception as exc:  # the API, 404, 403, a bad key: said, counted, kept
            self.reload_error = f"{type(exc).__name__}: {exc}"[:300]
            self.reloads["error"] += 1
            log.warning("recorder: multi-cluster secret: %s", self.reload_error)
            return False
        self.reload_error = ""
        with self._lock:
            current = {n: w for n, w in self.watches.items() if w.source.origin == "secret"}
            fixed = {n for n, w in self.watches.items() if w.source.origin != "secret"}
        gone = [w for n, w in current.items() if wanted.get(n) != w.source.text]
        added = [
            n
            for n, text in wanted.items()
            if n not in fixed and (n not in current or current[n].source.text != text)
        ]
        for n in sorted(set(wanted) & fixed):
            log.warning(
                "recorder: multi-cluster secret: %s is configured already; its key " "is ignored", n
            )
        if not gone and not added:
            self.reloads["unchanged"] += 1
            return True
        for w in gone:
            with self._lock:
                self.watches.pop(w.name, None)
            w.stop()
            if w.name in wanted:
                log.info("recorder: cluster %s: stopped (its kubeconfig changed)", w.name)
                continue
            if not self.watching:  # the leader takes its finalizers off
                continue
            freed = w.release()
            self.released[w.name] = self.released.get(w.name, 0) + freed
            log.info(
                "recorder: cluster %s: stopped (its kubeconfig was removed), its "
                "finalizer taken off %d workloads",
                w.name,
                freed,
            )
        for n in sorted(added):
            w = ClusterWatch(n, Source("secret", text=wanted[n]), self.shared)
            if self.watching:
                w.recover()
                w.start()
            with self._lock:
                self.watches[n] = w
            log.info("recorder: cluster %s: %s", n, f"down: {w.error}" if w.error else "watched")
        self.reloads["ok"] += 1
        return True

    # -- what the API and metrics see --------------------------------------------------
    def scope(self, asked: str | None) -> Scope:
        """The cluster `?cluster=` names; the default one (the Management page's, else the
        home one) when none is named."""
        w = (
            self.get(asked)
            if asked
            else (self.get(self.default) if self.default else None) or self.get(self.home_name)
        )
        if w is None:
            known = ", ".join(sorted(w.name for w in self.all()))
            raise NotFound(f"no cluster {asked!r}; known: {known}")
        return w.scope()

    def scopes(self) -> list[Scope]:
        return [w.scope() for w in self.all() if w.tracker is not None]

    def names(self) -> list[str]:
        return sorted(w.name for w in self.all())

    def listing(self) -> list[dict[str, Any]]:
        """Each cluster, whether it is watched and up, and why not (GET /api/clusters)."""
        order = sorted(self.all(), key=lambda w: (w.name != self.home_name, w.name))
        if not self.watching and self.shared.cfg.recorder.leader_election.enabled:
            # a replica that does not lead: the leader watches (its /readyz says how)
            return [
                {
                    "name": w.name,
                    "source": w.source.origin,
                    "up": None,
                    "error": w.error or "watched by the leading replica",
                    "home": w.name == self.home_name,
                }
                for w in order
            ]
        return [{**w.state(), "home": w.name == self.home_name} for w in order]

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        up = gauge(
            "lens_recorder_cluster_up", "1 while the cluster's API is watched and " "answering"
        )
        for w in sorted(self.all(), key=lambda w: w.name):
            up.add({"cluster": w.name}, 1 if w.up else 0)
        yield up
        yield counter(
            "lens_recorder_cluster_reloads",
            "Reads of the multi-cluster Secret, " "by result",
            self.reloads,
            "result",
        )
        yield counter(
            "lens_recorder_cluster_finalizers_released",
            "Finalizers taken off a cluster's workloads as it left the multi-cluster " "Secret",
            dict(self.released),
            "cluster",
        )


class StorageConfigSync(Collector):
    """multicluster.storage_config_sync: every cluster's source_secret merged into the home
    cluster's merged_secret."""

    RESULTS = ("written", "unchanged", "conflict", "unreadable", "error")

    def __init__(self, clusters: Clusters) -> None:
        self.clusters = clusters
        mc = clusters.shared.cfg.multicluster
        self.source, self.merged, self.interval = (
            mc.source_secret,
            mc.merged_secret,
            mc.sync_seconds,
        )
        self.timeout = clusters.shared.cfg.kubernetes.request_timeout_seconds
        self.runs: dict[str, int] = dict.fromkeys(self.RESULTS, 0)
        self.unreadable: dict[str, str] = {}  # cluster -> why, in the last run
        self.missing: list[str] = []  # clusters without a source secret, in the last run

    def collected(self) -> tuple[dict[str, str], dict[str, str], list[str]]:
        """(cluster -> the JSON of its source secret's data, unreadable cluster -> why,
        clusters that have none)."""
        ns = self.clusters.namespace
        got: dict[str, str] = {}
        bad: dict[str, str] = {}
        missing: list[str] = []
        for w in sorted(self.clusters.all(), key=lambda w: w.name):
            if w.client is None:
                bad[w.name] = w.error or "no API client"
                continue
            try:
                doc = call_raw(
                    w.api.core.read_namespaced_secret, self.source, ns, timeout=self.timeout
                )
            except Exception as exc:
                if getattr(exc, "status", None) == 404:
                    missing.append(w.name)
                else:
                    bad[w.name] = f"{type(exc).__name__}: {exc}"[:300]
                continue
            # Go's json.Marshal of the Secret's map[string][]byte: keys sorted, values
            # base64, no spaces (what the seed's exporter stores)
            got[w.name] = json.dumps(doc.get("data") or {}, sort_keys=True, separators=(",", ":"))
        return got, bad, missing

    def run_once(self) -> str:
        """One sync; its result."""
        try:
            got, bad, missing = self.collected()
        except Exception as exc:  # pragma: no cover - collected catches per cluster
            log.warning("recorder: storage config sync: %s", exc)
            return self._count("error")
        self.unreadable, self.missing = bad, missing
        if bad:
            why = "; ".join(f"{k}: {v}" for k, v in sorted(bad.items()))
            log.warning("recorder: storage config sync: not written: %s", why)
            return self._count("unreadable")
        data = {name: base64.b64encode(text.encode()).decode() for name, text in got.items()}
        core, ns = self.clusters.home.api.core, self.clusters.namespace
        try:
            try:
                cur = call_raw(core.read_namespaced_secret, self.merged, ns, timeout=self.timeout)
            except Exception as exc:
                if getattr(exc, "status", None) != 404:
                    raise
                body = {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "type": "Opaque",
                    "metadata": {"name": self.merged, "namespace": ns},
                    "data": data,
                }
                call_raw(core.create_namespaced_secret, ns, body, timeout=self.timeout)
                return self._count("written")
            if (cur.get("data") or {}) == data:
                return self._count("unchanged")
            cur["data"] = data  # with its resourceVersion: a concurrent change is a 409
            call_raw(core.replace_namespaced_secret, self.merged, ns, cur, timeout=self.timeout)
            return self._count("written")
        except Exception as exc:
            if getattr(exc, "status", None) == 409:
                log.info(
                    "recorder: storage config sync: %s changed meanwhile; next run", self.merged
                )
                return self._count("conflict")
            log.warning("recorder: storage config sync: %s", f"{type(exc).__name__}: {exc}"[:300])
            return self._count("error")

    def _count(self, result: str) -> str:
        self.runs[result] += 1
        return result

    def state(self) -> dict[str, Any]:
        return {
            "secret": self.merged,
            "runs": dict(self.runs),
            "unreadable": self.unreadable,
            "missing": self.missing,
        }

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        yield counter(
            "lens_recorder_storage_config_syncs",
            "Storage config exporter runs, by " "result",
            self.runs,
            "result",
        )
