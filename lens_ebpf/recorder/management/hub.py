"""The Management pages' parts, as the handlers reach them (Services.management)."""

from __future__ import annotations

from dataclasses import dataclass

from lens_ebpf.recorder.management.clusters import ClusterAdmin
from lens_ebpf.recorder.management.releases import Releases
from lens_ebpf.recorder.management.settings import Settings
from lens_ebpf.recorder.management.tasks import Tasks


@dataclass
class Management:
    admin: ClusterAdmin  # the clusters, the default one
    tasks: Tasks  # initialize, deploy, rollback: run by the leader
    releases: Releases  # the versions, what each cluster runs
    settings: Settings  # what changes at run time, and its audit
