"""The Management pages' work on the service and its clusters: the clusters it follows
(clusters.py), the agent installed into one (manifest.py, tasks.py), the settings that
change at run time (settings.py), which lens-ebpf each cluster runs (releases.py) and
the record of the periodic jobs' runs (job_history.py)."""
