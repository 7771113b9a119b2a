"""The agent's features, found in these packages (core/registry.py): the config reads
their settings models from here, the agent their classes (agent/feature.py)."""

from __future__ import annotations

from lens_ebpf.core.registry import Registry

FEATURES = Registry(("lens_ebpf.agent.features", "lens_ebpf.agent.devices"))
