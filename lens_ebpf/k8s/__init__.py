"""Kubernetes awareness: API index, kubelet, PodResources."""
