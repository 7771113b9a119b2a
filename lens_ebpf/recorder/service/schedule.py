"""The recorder's periodic jobs, one list by domain (RecorderApp.jobs_to_run() joins them
in this order): the allocation statistics', training's and the outliers'; the alerts'; the
Management pages' and the deep dive's; every replica's remote-write maps and the jobs a
setting adds. Each is a Job of the one runner (core/runner.py), made one of two ways
(recorder/jobs): leader_job(), work that writes or acts on the cluster, run by the leader
alone; replica_job(), every replica's own (each cluster's storage scan is a leader_job its
ClusterWatch adds)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lens_ebpf.core.runner import Job
from lens_ebpf.recorder.alerts import late
from lens_ebpf.recorder.jobs import leader_job, replica_job

if TYPE_CHECKING:
    from lens_ebpf.recorder.service import RecorderApp


def allocation(app: RecorderApp) -> list[Job]:
    """The allocation statistics (snapshot, hourly and prune share a thread: their first
    runs in this order), training's checks and the outliers."""
    r, clock, alloc, lane = app.cfg.recorder, app.clock, app.jobs, "allocation"
    every = r.jobs.allocation_seconds
    return [
        leader_job("snapshot", every, lambda: alloc.snapshot(clock()), at_start=True, lane=lane),
        leader_job("hourly", every, lambda: alloc.hourly(clock()), at_start=True, lane=lane),
        leader_job("prune", 3600, lambda: alloc.prune(clock()), at_start=True, lane=lane),
        leader_job(
            "training", r.training.check_seconds, lambda: app.training.check(clock()), quiet=()
        ),
        leader_job("outliers", r.jobs.outliers_seconds, app.outliers.run_counted),
    ]


def alerts(app: RecorderApp) -> list[Job]:
    r, jobs = app.cfg.recorder, app.alerts.jobs
    return [
        # the shipped log templates and rules and metric rules, once (idempotent)
        leader_job("alerts_seed", 3600, app.alerts.seed, at_start=True),
        leader_job("alerts_findings", r.alerts.findings_seconds, jobs.findings),
        leader_job("alerts_notify", r.alerts.notify_seconds, jobs.notify),
        # alerts stored before their pod or GPU was known, enriched once it is
        leader_job("alerts_enrich", late.SECONDS, jobs.enrich),
    ]


def management(app: RecorderApp) -> list[Job]:
    r, clock, m = app.cfg.recorder, app.clock, app.management
    return [
        # the Management pages': settings changed at run time and the default cluster
        # (every replica), runs recorded, frameworks detected, tasks run on clusters,
        # each cluster's agent version read
        replica_job("settings", 10, app.apply_stored, at_start=True),
        replica_job("job_history", 5, app.job_history.flush),
        # py-spy tasks whose replica stopped while they ran: failed, saying so
        replica_job("pyspy_expire", 60, app.deepdive.expire, at_start=True),
        # fetched profiler traces past recorder.profiler.retention_hours
        leader_job("profiler_prune", 3600, lambda: app.profiler.prune(clock()), at_start=True),
        # (the retention read at each run: a setting changed at run time)
        leader_job(
            "job_history_prune",
            3600,
            lambda: app.job_history.prune(clock(), r.job_history.retention_days),
            at_start=True,
        ),
        leader_job("detection", r.detection.interval_seconds, app.detection.run),
        leader_job("cluster_tasks", r.management.task_seconds, m.tasks.run),
        leader_job(
            "release_scan", r.management.release_scan_seconds, m.releases.scan, at_start=True
        ),
    ]


def added(app: RecorderApp) -> list[Job]:
    """Every replica's remote-write maps, then the jobs a setting adds."""
    r, mc, clock = app.cfg.recorder, app.cfg.multicluster, app.clock
    index = app.remote_write.indexer
    # every replica answers remote writes from its own maps
    jobs = [replica_job("remote_write_index", index.interval, index.refresh_counted, at_start=True)]
    # the last completed week's report, once, when due; first looked for one check after
    # start, not at it: a start (every replica's, every test's) does not wait on Chromium
    if r.reports.weekly:
        jobs.append(
            leader_job("weekly_report", r.reports.check_seconds, lambda: app.reports.run(clock()))
        )
    if (sync := app.storage_sync) is not None:
        jobs.append(
            leader_job("storage_config_sync", sync.interval, sync.run_once, at_start=True, quiet=())
        )
    if mc.secret:  # read once by clusters.start(); every replica knows the clusters
        # (?cluster= is served everywhere), the leader alone watches them
        jobs.append(
            replica_job("clusters_reload", mc.reload_seconds, app.clusters.reload, quiet=())
        )
    if (kubelet := app.kubelet) is not None:
        jobs.append(
            leader_job(
                "kubelet_service", kubelet.interval, kubelet.sync_counted, at_start=True, quiet=()
            )
        )
    return jobs
