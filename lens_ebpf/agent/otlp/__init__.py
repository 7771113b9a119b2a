"""OTLP/HTTP out (collectors.otlp): the agent's metrics and events to an OpenTelemetry
endpoint, protobuf-encoded as opentelemetry-proto defines the messages.

semconv.py names the resources (the node; a pod and container where a series or an event
belongs to one), wire.py writes the protobuf fields the hot paths make per series and per
event (tests/unit/test_otlp.py holds them equal to opentelemetry-proto's own encoding),
metrics.py and logs.py make the requests, exporter.py sends them (queues, batching,
retry with backoff, what it dropped). The feature is agent/features/otlp.py; the page
docs/agent/otlp.md.
"""
