"""The agent's view of the cluster: API connection, pod/service reflectors, cluster CIDRs.

No API configured (no in-cluster account, no kubeconfig) is standalone mode:
the agent classifies by policy.yaml alone. An API that is configured but broken is
logged and retried; it never stops the agent.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from lens_ebpf.agent.net.policy_watch import ClusterNetworks
from lens_ebpf.agent.pods.index import ClusterIndex, Getter, OwnerResolver
from lens_ebpf.core.exposition import counter, gauge
from lens_ebpf.core.networks import Network
from lens_ebpf.k8s.objects import ObjectError, kubeadm_networks, node_pod_cidrs
from lens_ebpf.k8s.reflector import Reflector, call_raw, watch_metrics

log = logging.getLogger(__name__)


def read_cluster_networks(
    get_kubeadm: Callable[[], dict[str, Any]],
    list_nodes: Callable[[], dict[str, Any]],
) -> ClusterNetworks:
    """Pod and service CIDRs: kubeadm-config first, then the nodes' spec.podCIDRs.

    A source that is missing or malformed is logged and skipped; the result may be empty.
    """
    out = ClusterNetworks()
    try:
        out.pods, out.services = kubeadm_networks(get_kubeadm())
        out.source = "kubeadm-config"
    except ObjectError as exc:
        log.warning("cluster CIDRs: %s; trying the nodes' podCIDRs", exc)
    except Exception as exc:  # 404 on non-kubeadm clusters, 403, API down
        log.info(
            "cluster CIDRs: no kubeadm-config (%s); trying the nodes' podCIDRs",
            getattr(exc, "reason", None) or type(exc).__name__,
        )
    if not out.pods:
        nets: list[Network] = []
        try:
            for node in list_nodes().get("items") or ():
                try:
                    nets.extend(n for n in node_pod_cidrs(node) if n not in nets)
                except ObjectError as exc:
                    log.warning("cluster CIDRs: %s", exc)
        except Exception as exc:
            log.info("cluster CIDRs: cannot list nodes (%s)", type(exc).__name__)
        if nets:
            out.pods = tuple(nets)
            out.source = f"{out.source}+node podCIDRs" if out.source else "node podCIDRs"
    return out


def raw_getter(fn: Callable[..., Any], timeout: float) -> Getter:
    """A kubernetes client read_namespaced_* method as a getter of the raw JSON object."""
    return lambda namespace, name: call_raw(fn, name, namespace, timeout=timeout)


class FirstServed:
    """One kind read at each API version that has served it, newest first (CronJob:
    batch/v1 from 1.21, batch/v1beta1 until 1.25; 1.20 answers batch/v1 with 404). A 404
    asks the next version; the one that answered is asked first from then on, so an older
    cluster costs one 404 in all."""

    def __init__(self, *getters: Getter) -> None:
        self.getters = getters
        self.first = 0

    def __call__(self, namespace: str, name: str) -> dict[str, Any]:
        missing: Exception | None = None
        for i in (self.first, *(i for i in range(len(self.getters)) if i != self.first)):
            try:
                obj = self.getters[i](namespace, name)
            except Exception as exc:
                if getattr(exc, "status", None) != 404:
                    raise
                missing = exc
                continue
            self.first = i
            return obj
        assert missing is not None
        raise missing


class ClusterWatch:
    """Reflectors for pods and services feeding one ClusterIndex."""

    def __init__(self, api: Any, k: Any) -> None:
        from kubernetes import client

        self.cfg = k
        core = client.CoreV1Api(api)
        apps = client.AppsV1Api(api)
        batch = client.BatchV1Api(api)
        custom = client.CustomObjectsApi(api)  # any group/version: batch/v1beta1 here
        t = k.request_timeout_seconds

        def cron_job_v1beta1(namespace: str, name: str) -> dict[str, Any]:
            return call_raw(
                custom.get_namespaced_custom_object,
                "batch",
                "v1beta1",
                namespace,
                "cronjobs",
                name,
                timeout=t,
            )

        getters: dict[str, Getter] = {
            "ReplicaSet": raw_getter(apps.read_namespaced_replica_set, t),
            "Deployment": raw_getter(apps.read_namespaced_deployment, t),
            "StatefulSet": raw_getter(apps.read_namespaced_stateful_set, t),
            "DaemonSet": raw_getter(apps.read_namespaced_daemon_set, t),
            "Job": raw_getter(batch.read_namespaced_job, t),
            "CronJob": FirstServed(raw_getter(batch.read_namespaced_cron_job, t), cron_job_v1beta1),
        }
        self.owners = OwnerResolver(getters, ttl=k.owner_cache_seconds)
        self.index = ClusterIndex(k.max_pods, k.max_services, self.owners)
        opts = {
            "request_timeout": t,
            "watch_timeout": k.watch_timeout_seconds,
            "backoff_max": k.backoff_max_seconds,
        }
        self.reflectors = [
            Reflector(
                "pods",
                core.list_pod_for_all_namespaces,
                self.index.replace_pods,
                self.index.pod_event,
                **opts,
            ),
            Reflector(
                "services",
                core.list_service_for_all_namespaces,
                self.index.replace_services,
                self.index.service_event,
                **opts,
            ),
        ]
        self._kubeadm = lambda: call_raw(
            core.read_namespaced_config_map, "kubeadm-config", "kube-system", timeout=t
        )
        self._nodes = lambda: call_raw(core.list_node, timeout=t)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for r in self.reflectors:
            t = threading.Thread(
                target=r.run, args=(self._stop,), name=f"k8s-{r.resource}", daemon=True
            )
            t.start()
            self._threads.append(t)

    def networks(self) -> ClusterNetworks:
        return read_cluster_networks(self._kubeadm, self._nodes)

    def wait_synced(self, timeout: float) -> bool:
        return all(r.synced.wait(timeout) for r in self.reflectors)

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout
        for r in self.reflectors:
            r.stop()
        for r, t in zip(self.reflectors, self._threads, strict=False):
            # cut again until the thread ends: a watch whose answer came after the first
            # cut would stay open until its timeout (and hold up an API server's shutdown)
            while t.is_alive() and time.monotonic() < deadline:
                t.join(0.02)
                r.stop()


class ClusterCollector(Collector):
    """The index's size and the watches' health."""

    def __init__(self, watch: ClusterWatch) -> None:
        self._w = watch

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        idx = self._w.index
        objs = gauge("lens_k8s_index_objects", "Objects in the pod/service index")
        refused = counter("lens_k8s_index_refused", "Objects refused by a full index")
        for kind, n in idx.counts().items():
            objs.add({"kind": kind}, n)
            refused.add({"kind": kind}, idx.refused[kind])
        bad = counter("lens_k8s_bad_objects", "Objects skipped as malformed")
        bad.add({}, idx.bad_objects)
        lists = counter("lens_k8s_lists", "Full lists (start, and after 410 Gone)")
        for r in self._w.reflectors:
            lists.add({"resource": r.resource}, r.lists)
        owners = counter("lens_k8s_owner_lookups", "Owner reference lookups")
        for result, n in self._w.owners.lookups.items():
            owners.add({"result": result}, n)
        watches = watch_metrics(
            self._w.reflectors,
            "lens_k8s_watch_connected",
            "lens_k8s_watch_restarts",
            "lens_k8s_watch_events",
        )
        yield from (objs, refused, bad, *watches, lists, owners)
