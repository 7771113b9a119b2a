"""The policy in force: the file (reloaded on change or SIGHUP) with its empty k8sPod/k8sSvc
classes filled from the cluster's CIDRs, published to everything that classifies."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from lens_ebpf.agent.net.policy import (
    Policy,
    PolicyError,
    load_policy,
    with_cluster_networks,
)
from lens_ebpf.core.exposition import counter, gauge
from lens_ebpf.core.networks import Network

log = logging.getLogger(__name__)
# told the effective policy; a ValueError refuses it (the last good one stays)
Consumer = Callable[[Policy], None]


def _signature(path: Path) -> tuple[float, int]:
    try:
        st = path.stat()
    except OSError:
        return (0.0, -1)
    return (st.st_mtime, st.st_size)


@dataclass
class ClusterNetworks:
    """The cluster's pod and service CIDRs, and where they were read."""

    pods: tuple[Network, ...] = ()
    services: tuple[Network, ...] = ()
    source: str = ""


class PolicyWatcher:
    """Loads the file, merges the cluster CIDRs, and tells each consumer the result."""

    def __init__(self, path: Path) -> None:
        """Raises PolicyError when the file cannot be used at start."""
        self.path = path
        self.policy = load_policy(path)  # the file's, last good
        self.signature = _signature(path)
        self.cluster = ClusterNetworks()
        self.last_error = ""
        self.reloads = {"success": 0, "failure": 0}
        self.reload_requested = threading.Event()  # SIGHUP
        self._consumers: list[Consumer] = []
        self._lock = threading.Lock()

    def effective(self, policy: Policy | None = None) -> Policy:
        """The policy with its empty k8sPod/k8sSvc classes taken from the cluster."""
        c = self.cluster
        return with_cluster_networks(policy or self.policy, c.pods, c.services)[0]

    def filled(self) -> list[str]:
        """Which classes the cluster's CIDRs filled."""
        c = self.cluster
        return with_cluster_networks(self.policy, c.pods, c.services)[1]

    def subscribe(self, consumer: Consumer) -> None:
        """Tell consumer the policy in force now, then every change: a change published
        while the consumer was starting (cluster CIDRs found meanwhile) is not lost."""
        with self._lock:
            consumer(self.effective())
            self._consumers.append(consumer)

    def _publish(self, policy: Policy) -> None:
        with self._lock:
            effective = self.effective(policy)
            for consumer in self._consumers:
                consumer(effective)

    def set_cluster_networks(self, cidrs: ClusterNetworks) -> None:
        """New pod/service CIDRs from the cluster: publish again if they changed."""
        if (cidrs.pods, cidrs.services) == (self.cluster.pods, self.cluster.services):
            return
        self.cluster = cidrs
        log.info(
            "cluster CIDRs from %s: pods %s, services %s",
            cidrs.source or "nowhere",
            [str(n) for n in cidrs.pods],
            [str(n) for n in cidrs.services],
        )
        try:
            self._publish(self.policy)
        except ValueError as exc:
            log.error("cluster CIDRs not applied: %s", exc)

    def reload(self, why: str) -> bool:
        """Load the file again; on error keep the last good policy and say why."""
        self.signature = _signature(self.path)
        try:
            policy = load_policy(self.path)
            self._publish(policy)
        except (PolicyError, ValueError) as exc:
            self.last_error = str(exc)
            self.reloads["failure"] += 1
            log.error("policy reload (%s) failed, keeping the last good policy: %s", why, exc)
            return False
        self.policy = policy
        self.last_error = ""
        self.reloads["success"] += 1
        log.info("policy reloaded (%s) from %s", why, self.path)
        return True

    def check(self) -> None:
        """Reload on a changed file or a SIGHUP (the agent's runner asks every
        policy.watch_interval_seconds)."""
        changed = _signature(self.path) != self.signature
        if self.reload_requested.is_set() or changed:
            self.reload_requested.clear()
            self.reload("file changed" if changed else "SIGHUP")

    def status(self) -> dict[str, Any]:
        return {"path": str(self.path), "error": self.last_error, "reloads": self.reloads}


class PolicyCollector(Collector):
    """Policy reloads by result, and whether the last one failed."""

    def __init__(self, watcher: PolicyWatcher) -> None:
        self._w = watcher

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        reloads = counter("lens_agent_policy_reloads", "Policy reloads by result")
        for result, n in self._w.reloads.items():
            reloads.add({"result": result}, n)
        yield reloads
        yield gauge(
            "lens_agent_policy_error",
            "1 while the last policy reload failed",
            1 if self._w.last_error else 0,
        )
