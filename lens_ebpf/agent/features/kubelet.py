"""The kubelet's figures: GPU allocation (node_k8s_gpu_allocation_rate), ephemeral storage."""

from __future__ import annotations

from lens_ebpf.agent.feature import CollectorFeature, register
from lens_ebpf.agent.pods.kubelet import SA_CA, KubeletClient, KubeletCollector
from lens_ebpf.core.collector import PeriodicCollector


@register("kubelet", order=20)
class KubeletFeature(CollectorFeature):
    def enabled(self) -> str:
        kl = self.ctx.kubernetes.kubelet
        if not kl.enabled:
            return "disabled by config"
        if self.ctx.enrich.index is None and not kl.url:
            return "standalone: no Kubernetes API and no kubernetes.kubelet.url"
        return ""

    def make(self) -> PeriodicCollector:
        kl, node = self.ctx.kubernetes.kubelet, self.ctx.node
        url = kl.url or f"https://{node.ip or node.name}:10250"
        client = KubeletClient(
            url, kl.ca_file or SA_CA, kl.token_file, kl.insecure_skip_verify, kl.timeout_seconds
        )
        return KubeletCollector(
            kl.interval_seconds,
            client,
            node.name,
            kl.gpu_resources,
            lambda: self.ctx.offers.gpu_count(),
        )
