"""The recorder's periodic jobs, one list by domain (RecorderApp.jobs_to_run() joins them
in this order): the allocation statistics', training's and the outliers'; the alerts'; the
Management pages' and the deep dive's; every replica's remote-write maps and the jobs a
setting adds. Each is a Job of the one runner (core/runner.py); leader-only ones write or
act on the cluster, and one replica does that (each cluster's storage scan is added by its
ClusterWatch, leader-only)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lens_ebpf.core.runner import Job
from lens_ebpf.recorder.alerts import late
from lens_ebpf.recorder.jobs import FAILURES

if TYPE_CHECKING:
    from lens_ebpf.recorder.service import RecorderApp


def allocation(app: RecorderApp) -> list[Job]:
    """The allocation statistics (snapshot, hourly and prune share a thread: their first
    runs in this order), training's checks and the outliers."""
    r, clock, alloc = app.cfg.recorder, app.clock, app.jobs
    every = r.jobs.allocation_seconds
    return [
        Job(
            "snapshot",
            every,
            lambda: alloc.snapshot(clock()),
            leader_only=True,
            at_start=True,
            lane="allocation",
            quiet=FAILURES,
        ),
        Job(
            "hourly",
            every,
            lambda: alloc.hourly(clock()),
            leader_only=True,
            at_start=True,
            lane="allocation",
            quiet=FAILURES,
        ),
        Job(
            "prune",
            3600,
            lambda: alloc.prune(clock()),
            leader_only=True,
            at_start=True,
            lane="allocation",
            quiet=FAILURES,
        ),
        Job(
            "training",
            r.training.check_seconds,
            lambda: app.training.check(clock()),
            leader_only=True,
        ),
        Job(
            "outliers",
            r.jobs.outliers_seconds,
            app.outliers.run_counted,
            leader_only=True,
            quiet=FAILURES,
        ),
    ]


def alerts(app: RecorderApp) -> list[Job]:
    r = app.cfg.recorder
    return [
        # the shipped log templates and rules and metric rules, once (idempotent)
        Job("alerts_seed", 3600, app.alerts.seed, leader_only=True, at_start=True, quiet=FAILURES),
        Job(
            "alerts_findings",
            r.alerts.findings_seconds,
            app.alerts.jobs.findings,
            leader_only=True,
            quiet=FAILURES,
        ),
        Job(
            "alerts_notify",
            r.alerts.notify_seconds,
            app.alerts.jobs.notify,
            leader_only=True,
            quiet=FAILURES,
        ),
        # alerts stored before their pod or GPU was known, enriched once it is
        Job(
            "alerts_enrich", late.SECONDS, app.alerts.jobs.enrich, leader_only=True, quiet=FAILURES
        ),
    ]


def management(app: RecorderApp) -> list[Job]:
    r, clock = app.cfg.recorder, app.clock
    return [
        # the Management pages': settings changed at run time and the default cluster
        # (every replica), runs recorded, frameworks detected, tasks run on clusters,
        # each cluster's agent version read
        Job("settings", 10, app.apply_stored, leader_only=False, at_start=True, quiet=FAILURES),
        Job("job_history", 5, app.job_history.flush, leader_only=False, quiet=FAILURES),
        # py-spy tasks whose replica stopped while they ran: failed, saying so
        Job(
            "pyspy_expire",
            60,
            app.deepdive.expire,
            leader_only=False,
            at_start=True,
            quiet=FAILURES,
        ),
        # fetched profiler traces past recorder.profiler.retention_hours
        Job(
            "profiler_prune",
            3600,
            lambda: app.profiler.prune(clock()),
            leader_only=True,
            at_start=True,
            quiet=FAILURES,
        ),
        Job(
            "job_history_prune",
            3600,
            lambda: app.job_history.prune(clock(), r.job_history.retention_days),
            leader_only=True,
            at_start=True,
            quiet=FAILURES,
        ),
        Job(
            "detection",
            r.detection.interval_seconds,
            app.detection.run,
            leader_only=True,
            quiet=FAILURES,
        ),
        Job(
            "cluster_tasks",
            r.management.task_seconds,
            app.management.tasks.run,
            leader_only=True,
            quiet=FAILURES,
        ),
        Job(
            "release_scan",
            r.management.release_scan_seconds,
            app.management.releases.scan,
            leader_only=True,
            at_start=True,
            quiet=FAILURES,
        ),
    ]


def added(app: RecorderApp) -> list[Job]:
    """Every replica's remote-write maps, then the jobs a setting adds."""
    r, mc, clock = app.cfg.recorder, app.cfg.multicluster, app.clock
    jobs = [
        # every replica answers remote writes from its own maps
        Job(
            "remote_write_index",
            app.remote_write.indexer.interval,
            app.remote_write.indexer.refresh_counted,
            leader_only=False,
            at_start=True,
            quiet=FAILURES,
        ),
    ]
    # the last completed week's report, once, when due; first looked for one check after
    # start, not at it: a start (every replica's, every test's) does not wait on Chromium
    if r.reports.weekly:
        jobs.append(
            Job(
                "weekly_report",
                r.reports.check_seconds,
                lambda: app.reports.run(clock()),
                leader_only=True,
                quiet=FAILURES,
            )
        )
    if app.storage_sync is not None:
        jobs.append(
            Job(
                "storage_config_sync",
                app.storage_sync.interval,
                app.storage_sync.run_once,
                leader_only=True,
                at_start=True,
            )
        )
    if mc.secret:  # read once by clusters.start(); every replica knows the clusters
        # (?cluster= is served everywhere), the leader alone watches them
        jobs.append(
            Job("clusters_reload", mc.reload_seconds, app.clusters.reload, leader_only=False)
        )
    if app.kubelet is not None:
        jobs.append(
            Job(
                "kubelet_service",
                app.kubelet.interval,
                app.kubelet.sync_counted,
                leader_only=True,
                at_start=True,
            )
        )
    return jobs
