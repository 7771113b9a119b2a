"""Prometheus remote write in, workload series out (the telemetry processor's metrics side)."""
