"""Training progress: the points parsed from the pods' logs and what the service found
in them."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    String,
    Table,
    UniqueConstraint,
)

from lens_ebpf.recorder.store.schema.meta import NAME, UID, metadata

# training progress from the pods' logs (POST /logs): one row per progress line a format
# parsed; line_key (the pod, the line's time and text) makes a line sent twice one row
training_points = Table(
    "training_points",
    metadata,
    Column("cluster", String(NAME), nullable=False),
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("workload_uid", String(UID), nullable=False),  # the pod's top workload
    Column("pod_uid", String(UID), nullable=False),
    Column("namespace", String(NAME), nullable=False),
    Column("pod", String(NAME), nullable=False),
    Column("node", String(NAME), nullable=False, default=""),
    Column("at", DateTime(timezone=True), nullable=False),  # the line's time
    Column("received_at", DateTime(timezone=True), nullable=False),
    Column("format", String(32), nullable=False),  # megatron, torchtitan, hf_trainer, ...
    Column("iteration", BigInteger, nullable=True),
    Column("target_iterations", BigInteger, nullable=True),
    Column("iteration_seconds", Float, nullable=True),
    Column("tokens_per_second", Float, nullable=True),  # per GPU
    Column("tflops_per_gpu", Float, nullable=True),
    Column("loss", Float, nullable=True),
    Column("skipped_iterations", Integer, nullable=True),
    Column("nan_iterations", Integer, nullable=True),
    Column("samples_per_second", Float, nullable=True),
    Column("line_key", String(64), nullable=False),
    UniqueConstraint("cluster", "line_key", name="uq_training_points_line"),
)
Index("ix_training_points_workload_at", training_points.c.workload_uid, training_points.c.at)

# what the service found in a workload's progress and signals: training_slowdown,
# training_stalled, outlier (a pod apart from the others on a signal)
training_events = Table(
    "training_events",
    metadata,
    Column("cluster", String(NAME), nullable=False),
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("workload_uid", String(UID), nullable=False),  # the top workload
    Column("namespace", String(NAME), nullable=False),
    Column("workload", String(NAME), nullable=False),  # its name
    Column("pod_uid", String(UID), nullable=False, default=""),  # "" for the whole workload
    Column("pod", String(NAME), nullable=False, default=""),
    Column("node", String(NAME), nullable=False, default=""),
    Column("kind", String(32), nullable=False),
    Column("signal", String(32), nullable=False, default=""),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True), nullable=True),
    Column("iteration", BigInteger, nullable=True),
    Column("value", Float, nullable=True),  # the iteration's seconds, the signal's value
    Column("baseline", Float, nullable=True),  # the median it was compared with
    Column("detail", JSON, nullable=False),
)
Index("ix_training_events_workload_at", training_events.c.workload_uid, training_events.c.at)
