"""Alerts that name the workload (docs/recorder/alerts.md): Alertmanager's (and VMAlert's)
webhooks and generic ones in, our own from log rules and the service's findings, each
stored once with its history and enriched with the workload, pod, node and GPU it
concerns; correlated on read; silenced here and in Alertmanager; metric rules written as
PrometheusRule objects (or a rules file); the Primus-Lens UI's Alert pages' routes.

The rooms: model.py (the rows' JSON, severities, times), ingest.py (bodies in, stored
once), enrich.py (labels to workload, pod, node, GPU), silences.py, correlate.py,
logrules.py (the engine), logtemplates.py (the shipped templates), findings.py (the
service's own), notify.py (Alertmanager and webhook channels), rules.py (metric rules to
Prometheus), channels.py, overview.py (summary, trend, top sources, by cluster),
logstore.py (the log rules and templates as the pages change them), patterns.py (RE2). The
service holds them as one (service.py); the periodic work is jobs.py; the routes
api/alerts.py, alert_silences.py, metric_rules.py and log_rules.py."""
