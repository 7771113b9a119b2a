"""kubelet PodResources v1: which pod holds which GPU (offered as gpu_assignments)."""

from __future__ import annotations

from lens_ebpf.devices.collector import DeviceCollector, DeviceFeature
from lens_ebpf.feature import register
from lens_ebpf.k8s.podresources import PodResourcesCollector


@register("pod_resources", order=20)
class PodResourcesFeature(DeviceFeature):
    def enabled(self) -> str:
        return "" if self.ctx.cfg.kubernetes.pod_resources.enabled else "disabled by config"

    def make(self) -> DeviceCollector:
        prc = PodResourcesCollector.from_config(self.ctx.cfg.kubernetes)
        self.ctx.offers["gpu_assignments"] = lambda: prc.assigned
        return prc
