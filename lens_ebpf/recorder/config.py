"""The recorder's settings: shipped defaults (recorder/defaults.yaml), a YAML file,
the environment, flags, in that order (core/settings.py)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from importlib import resources
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from lens_ebpf.core import settings
from lens_ebpf.core.settings import Section, ServerConfig, split_listen
from lens_ebpf.k8s.client import KubernetesClientConfig
from lens_ebpf.protocol.collector_server import MAX_SEQ_JUMP
from lens_ebpf.protocol.stream_auth import CollectorAuthConfig
from lens_ebpf.protocol.tls import ServerTlsConfig

CLUSTER_NAME = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"  # a DNS label: no "/" in it


class KubeletServiceConfig(Section):
    enabled: bool = False
    namespace: str = "kube-system"
    name: str = "kubelet"
    interval_seconds: float = Field(30.0, gt=0)
    ports: dict[str, int] = Field(
        default_factory=lambda: {"https-metrics": 10250, "http-metrics": 10255, "cadvisor": 4194}
    )


class PrometheusConfig(Section):
    url: str = ""  # a Prometheus-compatible HTTP API; empty: the metric routes answer 503
    timeout_seconds: float = Field(10.0, gt=0)
    max_points: int = Field(11_000, ge=1, le=1_000_000)  # per series, in a range query


class JobsConfig(Section):
    allocation_seconds: float = Field(30.0, gt=0)  # GPU allocation snapshots, hourly stats
    outliers_seconds: float = Field(60.0, gt=0)  # workloads' pods compared (the outlier rule)


class IngestConfig(Section):
    """Who may POST (logs, remote write): a bearer token, or nobody beyond loopback."""

    token_file: str = ""  # the token, one line; empty: no token
    allow_anonymous: bool = False  # without a token, take POSTs beyond loopback too
    # without a token: Host names a POST may be sent to (and Origins it may come from)
    # besides addresses and localhost
    anonymous_hosts: list[str] = Field(default_factory=list)


class ApiConfig(Section):
    """Who may change the cluster API's state (its POST, PUT, PATCH and DELETE routes:
    rules, silences, channels): a client certificate server.tls.client_ca verified, or
    this bearer token; without a token, writes are taken only on a loopback listen."""

    token_file: str = ""  # the token, one line; empty: no token
    allow_anonymous: bool = False  # without a token, take writes beyond loopback too
    # without a token: Host names a write may be sent to (and Origins it may come from)
    # besides addresses and localhost
    anonymous_hosts: list[str] = Field(default_factory=list)
    # whose X-Forwarded-User names who made a change: "token" (writes with token_file's
    # token, as the UI's proxy presents it), "cert:<subject>" (a client certificate's
    # commonName), "": nobody's (the change records its credentials: the certificate's
    # subject, "token" or "anonymous")
    forwarded_user_from: str = ""


class AlertsConfig(Section):
    """Alerts that name the workload (docs/recorder/alerts.md)."""

    alertmanager_url: str = ""  # our alerts and the silences go there; "": kept here only
    timeout_seconds: float = Field(10.0, gt=0)  # Alertmanager's, a webhook channel's answer
    notify_seconds: float = Field(30.0, gt=0)  # how often our alerts are sent on
    findings_seconds: float = Field(60.0, gt=0)  # how often the service's findings are looked at
    external_url: str = ""  # the UI's address: our alerts' generatorURL links to them
    rules_namespace: str = ""  # the metric rules' PrometheusRules; "": the service's own
    rule_labels: dict[str, str] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "lens-ebpf"}
    )  # for the operator's ruleSelector
    rules_file: str = ""  # without the PrometheusRule CRD: the rules written here too
    default_log_rules: bool = True  # the shipped GPU training log rules on at first start
    log_rules_reload_seconds: float = Field(10.0, gt=0)  # rules changed elsewhere read anew
    max_body_bytes: int = Field(4 << 20, ge=1024, le=1 << 30)  # a POST of alerts


class LogsConfig(Section):
    max_body_bytes: int = Field(16 << 20, ge=1024, le=1 << 30)  # sent, and once decompressed


class TrainingConfig(Section):
    window: int = Field(50, ge=3, le=10_000)  # iterations in the rolling median
    slowdown_factor: float = Field(1.5, gt=1)  # an iteration this many medians long: slowdown
    stall_factor: float = Field(5.0, gt=1)  # no progress for this many medians: stalled
    check_seconds: float = Field(5.0, gt=0)  # how often stalls are looked for
    series_ttl_seconds: float = Field(3600.0, gt=0)  # a workload's lens_training_* series
    # go this long after its last point


class TimelineConfig(Section):
    regression_factor: float = Field(2.0, gt=1)  # above this many times the baseline
    regression_minutes: float = Field(2.0, gt=0)  # for at least this long: a regression
    baseline_seconds: float = Field(3600.0, gt=0)  # the baseline: the median of this before


class AggregationConfig(Section):
    """GPU accounting's label and annotation dimensions and how far back backfill goes."""

    # the pods' label and annotation keys the statistics group by (their values)
    label_keys: list[str] = Field(
        default_factory=lambda: ["app.kubernetes.io/name", "team", "project"]
    )
    annotation_keys: list[str] = Field(default_factory=lambda: ["team", "project"])
    max_values: int = Field(50, ge=1, le=10_000)  # per key; the rest fold into "__other__"
    backfill_days: float = Field(7.0, ge=0, le=366)  # hours without snapshots, from lifetimes


class ReportsConfig(Section):
    """The weekly GPU utilization report (docs/recorder/reports.md)."""

    weekly: bool = True  # made by the leader for each cluster's last completed week
    weekday: Literal[
        "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"
    ] = "monday"
    hour: int = Field(9, ge=0, le=23)  # a week's report is due this hour of weekday after it
    timezone: str = "UTC"  # the weeks' and days' calendar (an IANA zone)
    check_seconds: float = Field(600.0, gt=0)  # how often the job looks for a due report
    pdf: bool = True  # printed by headless Chromium; off: HTML and JSON only
    chromium: str = Field("chromium", min_length=1)  # its command or path
    top_workloads: int = Field(10, ge=1, le=1000)  # the most idle workloads listed
    low_utilization_percent: float = Field(30.0, ge=0, le=100)  # a workload below: low
    keep_weeks: int = Field(104, ge=1)  # reports of weeks that ended longer ago are pruned

    @field_validator("timezone")
    @classmethod
    def _zone(cls, v: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"{v!r}: not an IANA timezone (UTC, Europe/Berlin, ...)") from None
        return v


class LeaderElectionConfig(Section):
    """Replicas: one leads (a coordination.k8s.io/v1 Lease, client-go's semantics) and does
    what must be done once; every one serves (docs/recorder/replicas.md)."""

    enabled: bool = False  # on: campaign for the Lease (needs PostgreSQL); off: one process
    namespace: str = ""  # the Lease's; "": the service's own (its service account's)
    name: str = Field("lens-ebpf-recorder", min_length=1)  # the Lease's name
    identity: str = ""  # this replica's; "": $POD_NAME, else the host name
    advertise: str = ""  # host:port the other replicas reach this one's REST at (the
    # leader takes the logs they are sent); "": $POD_IP (else the host name) and listen's port
    lease_duration_seconds: float = Field(15.0, gt=0)
    renew_deadline_seconds: float = Field(10.0, gt=0)
    retry_period_seconds: float = Field(2.0, gt=0)
    forward_timeout_seconds: float = Field(30.0, gt=0)  # a follower's wait for the leader

    @model_validator(mode="after")
    def _order(self) -> LeaderElectionConfig:
        if not (
            self.retry_period_seconds < self.renew_deadline_seconds < self.lease_duration_seconds
        ):
            raise ValueError(
                "retry_period_seconds < renew_deadline_seconds < lease_duration_seconds is "
                "required: a leader must give up before another may take over"
            )
        return self


class RetentionConfig(Section):
    days: float = Field(30.0, gt=0)  # allocation snapshots and the device changelog


class JobHistoryConfig(Section):
    """Every run of a recorder job the leader ran (docs/recorder/management.md)."""

    enabled: bool = True  # the leader records each run of each job
    retention_days: float = Field(7.0, gt=0)  # runs that began longer ago are pruned


class DetectionConfig(Section):
    """Workloads' training and inference frameworks from their evidence."""

    interval_seconds: float = Field(10.0, gt=0)  # how often new evidence is looked for
    max_attempts: int = Field(10, ge=1, le=1000)  # runs with no evidence before it rests
    batch: int = Field(500, ge=1, le=100_000)  # workloads detected again per run, at most


class ManagementConfig(Section):
    """The Management pages' cluster work: the agent installed into a cluster."""

    agent_image: str = ""  # the image initialize installs; "": the manifest's (deploy/agent)
    task_seconds: float = Field(2.0, gt=0)  # how often the leader looks for tasks to run
    release_scan_seconds: float = Field(60.0, gt=0)  # each cluster's agent version read anew


class StorageConfig(Section):
    scan_seconds: float = Field(60.0, gt=0)  # StorageClasses, volumes, claims, their usage
    pending_seconds: float = Field(300.0, gt=0)  # a claim Pending longer: unhealthy


class DeviceLabelRule(Section):
    """A label of other exporters' series that names a device, and what of the device it
    holds: a GPU's index, UUID, serial or PCI address, or an RDMA device."""

    label: str = Field(min_length=1)
    match: Literal["index", "uuid", "serial", "bdf", "rdma"]


def _device_rules() -> list[DeviceLabelRule]:
    return [
        DeviceLabelRule(label=label, match=match)
        for label, match in (
            ("UUID", "uuid"),  # dcgm-exporter
            ("gpu_uuid", "uuid"),  # AMD device-metrics-exporter, lens-ebpf's hw_gpu_*
            ("serial_number", "serial"),  # AMD device-metrics-exporter
            ("pci_bus_id", "bdf"),  # dcgm-exporter (eight-digit domain)
            ("gpu_id", "index"),  # AMD device-metrics-exporter, lens-ebpf
            ("gpu", "index"),  # dcgm-exporter
            ("gpu_index", "index"),  # lens-ebpf
            ("asic", "index"),
            ("device", "rdma"),  # lens-ebpf's and node_exporter's RDMA ports
        )
    ]


class BasicAuthConfig(Section):
    username: str = ""
    password_file: str = ""


class ClientTlsFiles(Section):
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    insecure_skip_verify: bool = False


class RemoteWriteConfig(Section):
    url: str = ""  # where series go (a remote write receiver); "": POST /prometheus is 503
    mode: Literal["workload", "proxy"] = "workload"  # proxy: every series is forwarded too
    job: str = Field("lens-ebpf-recorder", min_length=1)  # the copies' job label
    max_body_bytes: int = Field(16 << 20, ge=1024, le=1 << 30)  # sent, and once unpacked
    timeout_seconds: float = Field(30.0, gt=0)  # the downstream's answer
    bearer_token_file: str = ""
    basic_auth: BasicAuthConfig = Field(default_factory=BasicAuthConfig)
    tls: ClientTlsFiles = Field(default_factory=ClientTlsFiles)
    cache_seconds: float = Field(10.0, gt=0)  # the device -> pod -> workload maps are read anew
    node_labels: list[str] = Field(
        default_factory=lambda: [
            "primus_lens_node_name",
            "Hostname",
            "hostname",
            "node",
            "instance",
        ]
    )
    device_labels: list[DeviceLabelRule] = Field(default_factory=_device_rules)
    pod_labels: list[str] = Field(default_factory=lambda: ["pod", "pod_name", "exported_pod"])


class DeepDiveConfig(Section):
    enabled: bool = True
    agent_port: int = Field(9471, ge=1, le=65535)  # the agents' gRPC port (hostNetwork)
    token_file: str = ""  # the bearer token the recorder presents (its projected token)
    ca_file: str = ""  # the agents' gRPC TLS: the CA to trust; "": plaintext
    timeout_seconds: float = Field(15.0, gt=0)  # a process tree's or a dump's answer
    max_duration_seconds: int = Field(300, ge=1, le=3600)  # a sample's longest
    stall_stacks: bool = True  # a stall or a hang's log line: a py-spy dump of each rank
    stall_repeat_seconds: float = Field(600.0, gt=0)  # one capture per workload this long


class ProfilerConfig(Section):
    enabled: bool = True
    agent_port: int = Field(9471, ge=1, le=65535)  # the agents' gRPC port (ProfilerService)
    token_file: str = ""  # the bearer token the recorder presents (its projected token)
    ca_file: str = ""  # the agents' gRPC TLS: the CA to trust; "": plaintext
    timeout_seconds: float = Field(15.0, gt=0)  # a listing's answer
    fetch_timeout_seconds: float = Field(600.0, gt=0)  # a trace's bytes, whole
    max_file_bytes: int = Field(512 << 20, ge=1 << 16)  # a trace fetched, at most
    retention_hours: int = Field(168, ge=1)  # fetched bytes kept this long
    max_ranks: int = Field(64, ge=1, le=1024)  # traces one analysis reads together
    analysis_workers: int = Field(1, ge=1, le=16)  # analyses at once
    viewer_dir: str = ""  # speedscope's built files; "": <venv>/share/speedscope (setup.sh)


class RecorderConfig(Section):
    database_url: str = "sqlite:///lens-recorder.db"
    listen: str = "0.0.0.0:9480"  # REST (/workloads, /pods) and /metrics
    collect_listen: str = "0.0.0.0:9472"  # reporters' collector protocol; empty: off
    gpu_resources: list[str] = Field(default_factory=lambda: ["amd.com/gpu", "nvidia.com/gpu"])
    cluster_name: str = Field("local", pattern=CLUSTER_NAME)  # the home cluster's name
    finalizers: bool = True
    queue_max: int = Field(100_000, ge=1, le=10_000_000)
    db_retry_max_seconds: float = Field(10.0, gt=0)
    page_max: int = Field(1000, ge=1, le=100_000)
    kubelet_service: KubeletServiceConfig = Field(default_factory=KubeletServiceConfig)
    prometheus: PrometheusConfig = Field(default_factory=PrometheusConfig)
    jobs: JobsConfig = Field(default_factory=JobsConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    aggregation: AggregationConfig = Field(default_factory=AggregationConfig)
    reports: ReportsConfig = Field(default_factory=ReportsConfig)
    ingest: IngestConfig = Field(default_factory=IngestConfig)
    api: ApiConfig = Field(default_factory=ApiConfig)
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)
    logs: LogsConfig = Field(default_factory=LogsConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    timeline: TimelineConfig = Field(default_factory=TimelineConfig)
    remote_write: RemoteWriteConfig = Field(default_factory=RemoteWriteConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    leader_election: LeaderElectionConfig = Field(default_factory=LeaderElectionConfig)
    job_history: JobHistoryConfig = Field(default_factory=JobHistoryConfig)
    detection: DetectionConfig = Field(default_factory=DetectionConfig)
    management: ManagementConfig = Field(default_factory=ManagementConfig)
    profiler: ProfilerConfig = Field(default_factory=ProfilerConfig)  # traces, analysis
    deepdive: DeepDiveConfig = Field(default_factory=DeepDiveConfig)  # process trees, py-spy

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        split_listen(v)
        return v


class ClusterEntry(Section):
    """A cluster beyond the home one: how to reach its API, and where its metrics are."""

    kubeconfig: str = Field(min_length=1)  # a kubeconfig file, or in-cluster
    prometheus_url: str = ""  # its own Prometheus; "": recorder.prometheus.url


class MultiClusterConfig(Section):
    """Clusters beyond the home one from the seed's multi-k8s-config Secret (one key per
    cluster: its kubeconfig), and the storage config exporter."""

    secret: str = ""  # the Secret's name in namespace; "": not read (multi-k8s-config)
    namespace: str = ""  # "": the service's own (its service account's namespace)
    reload_seconds: float = Field(30.0, gt=0)  # the Secret is read again this often
    storage_config_sync: bool = False  # every sync_seconds: merged_secret from source_secret
    source_secret: str = Field("storage-config", min_length=1)  # read in every cluster
    merged_secret: str = Field("multi-storage-config", min_length=1)  # written in the home one
    sync_seconds: float = Field(30.0, gt=0)


class CollectorGrpcConfig(Section):
    tls: ServerTlsConfig = Field(default_factory=ServerTlsConfig)
    auth: CollectorAuthConfig = Field(default_factory=CollectorAuthConfig)  # who may report
    max_seq_jump: int = Field(MAX_SEQ_JUMP, ge=1)  # further past its agent instance's last: refused


class ClusterServerConfig(ServerConfig):
    tls: ServerTlsConfig = Field(default_factory=ServerTlsConfig)  # recorder.listen over HTTPS


class Config(Section):
    log_level: str = "info"
    server: ClusterServerConfig = Field(default_factory=ClusterServerConfig)
    kubernetes: KubernetesClientConfig = Field(default_factory=KubernetesClientConfig)
    grpc: CollectorGrpcConfig = Field(default_factory=CollectorGrpcConfig)
    recorder: RecorderConfig = Field(default_factory=RecorderConfig)
    # clusters beyond the home one (recorder.cluster_name, reached through kubernetes.*)
    clusters: dict[str, ClusterEntry] = Field(default_factory=dict)
    multicluster: MultiClusterConfig = Field(default_factory=MultiClusterConfig)

    @field_validator("clusters")
    @classmethod
    def _names(cls, v: dict[str, ClusterEntry]) -> dict[str, ClusterEntry]:
        for name in v:
            if not re.match(CLUSTER_NAME, name):
                raise ValueError(
                    f"cluster name {name!r}: lowercase letters, digits and '-' " "(a DNS label)"
                )
        return v

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        return settings.log_level(v)


def shipped() -> str:
    """recorder/defaults.yaml: every key with its default, documented."""
    return resources.files("lens_ebpf.recorder").joinpath("defaults.yaml").read_text()


def load(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[tuple[str, ...], Any] | None = None,
) -> Config:
    """The recorder's effective settings; ConfigError naming the key and why."""
    return settings.load(Config, [shipped()], path, env, overrides)


def defaults() -> dict[str, Any]:
    """Every key with its default: the models' and defaults.yaml."""
    return settings.defaults(Config, [shipped()])
