"""kubelet PodResources v1: which pod holds which GPU (offered as gpu_assignments)."""

from __future__ import annotations

from lens_ebpf.agent.feature import CollectorFeature, register
from lens_ebpf.agent.pods.podresources import PodResourcesCollector
from lens_ebpf.core.collector import PeriodicCollector


@register("pod_resources", order=20)
class PodResourcesFeature(CollectorFeature):
    def enabled(self) -> str:
        return "" if self.ctx.kubernetes.pod_resources.enabled else "disabled by config"

    def make(self) -> PeriodicCollector:
        prc = PodResourcesCollector.from_config(self.ctx.kubernetes)
        self.ctx.offers.gpu_assignments = lambda: prc.assigned
        return prc
