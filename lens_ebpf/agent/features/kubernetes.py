"""The cluster as an enrichment source: pod and service identity for every address, and
the cluster's CIDRs for the policy. Starts before the programs; standalone without an API."""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client.registry import Collector

from lens_ebpf.agent.feature import ERROR, OFF, RUNNING, Feature, register
from lens_ebpf.agent.pods.cluster import ClusterCollector, ClusterWatch
from lens_ebpf.core.runner import Job
from lens_ebpf.k8s.client import NotConfiguredError, api_client

log = logging.getLogger(__name__)


@register("kubernetes", order=0)
class KubernetesFeature(Feature):
    cluster: ClusterWatch | None = None

    def start(self) -> None:
        k = self.ctx.kubernetes
        try:
            api = api_client(k.mode, k.kubeconfig)
        except NotConfiguredError as exc:
            self.state = {"state": OFF, "reason": str(exc)}
            log.info("kubernetes: %s", exc)
            return
        except Exception as exc:  # a configured API that cannot be used: say so, run on
            self.state = {"state": ERROR, "reason": str(exc)}
            log.error("kubernetes: %s; running standalone on the policy", exc)
            return
        self.cluster = ClusterWatch(api, k)
        self.cluster.start()
        self.ctx.enrich.index = self.cluster.index
        self.state = {"state": RUNNING, "reason": ""}
        if k.cluster_cidrs:
            self.ctx.periodic.runner.add(
                Job(
                    "k8s-cidrs",
                    k.cidr_refresh_seconds,
                    self._refresh_cidrs,
                    leader_only=False,
                    at_start=True,
                )
            )

    def _refresh_cidrs(self) -> None:
        assert self.cluster is not None
        self.ctx.policy.set_cluster_networks(self.cluster.networks())

    def collectors(self) -> list[Collector]:
        return [ClusterCollector(self.cluster)] if self.cluster is not None else []

    def report(self) -> dict[str, Any]:
        if self.cluster is None:
            return {"kubernetes": None}
        nets = self.ctx.policy.cluster
        return {
            "kubernetes": {
                "watches": {
                    r.resource: {
                        "connected": r.connected,
                        "synced": r.synced.is_set(),
                        "resource_version": r.resource_version,
                        "last_error": r.last_error,
                    }
                    for r in self.cluster.reflectors
                },
                "index": self.cluster.index.counts(),
                "cluster_cidrs": {
                    "source": nets.source,
                    "pods": [str(n) for n in nets.pods],
                    "services": [str(n) for n in nets.services],
                    "policy_classes_filled": self.ctx.policy.filled(),
                },
            }
        }

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
