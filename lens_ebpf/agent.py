"""The agent process: loads what this node supports, serves /metrics, stops cleanly."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from lens_ebpf import __version__, kernel_headers, tracefs
from lens_ebpf.api.grpc_server import GrpcServer, server_credentials
from lens_ebpf.api.http import HttpServer, Response, envelope, json_response
from lens_ebpf.api.reporter import Reporter, channel_credentials
from lens_ebpf.bpf.loader import ATTACHED, OFF, BpfLoader, LoaderCollector, feature_view
from lens_ebpf.config import Config, policy_path
from lens_ebpf.containers.cgroups import CgroupIndex, cgroup_path, parse_cgroup
from lens_ebpf.containers.proc_events import NAME as NAME_PROCS
from lens_ebpf.containers.proc_events import (
    ContainerResolver,
    ProcEvents,
    ProcEventsCollector,
    identity,
    pods_view,
)
from lens_ebpf.containers.runtime import ContainerdState
from lens_ebpf.containers.watch import RuntimeWatcher
from lens_ebpf.devices import all_collectors
from lens_ebpf.devices.collector import CollectorSet
from lens_ebpf.devices.gpu.collector import GpuCollector
from lens_ebpf.events import EventBus, EventBusCollector
from lens_ebpf.k8s.cluster import (
    ClusterCollector,
    ClusterNetworks,
    ClusterWatch,
    NotConfigured,
    api_client,
)
from lens_ebpf.k8s.kubelet import SA_CA, KubeletClient, KubeletCollector
from lens_ebpf.k8s.podresources import PodResourcesCollector
from lens_ebpf.metrics.cache import CacheCollector, MetricCache
from lens_ebpf.net.policy import Policy, PolicyError, load_policy, with_cluster_networks
from lens_ebpf.net.tcp_flows import RTT, TcpFlows, TcpFlowsCollector

log = logging.getLogger(__name__)
RUNNING = "running"  # a device collector's feature state


class StartupError(Exception):
    """The agent cannot start; the message is one line for the operator."""


@dataclass
class PolicyState:
    """The policy in force, and what became of the last reload."""

    path: Path
    policy: Policy
    signature: tuple[float, int] = (0.0, 0)
    last_error: str = ""
    reloads: dict[str, int] = field(default_factory=lambda: {"success": 0, "failure": 0})


def _signature(path: Path) -> tuple[float, int]:
    try:
        st = path.stat()
    except OSError:
        return (0.0, -1)
    return (st.st_mtime, st.st_size)


class Agent:
    """Owns the cache, the programs, the HTTP server and the background loops."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.stop_event = threading.Event()
        self.reload_event = threading.Event()
        self.ready = False
        self.heartbeat = time.monotonic()
        self.cache = MetricCache(cfg.cache.ttl_seconds, cfg.cache.max_series, cfg.cache.families)
        self.bus = EventBus(cfg.events.queue_size, history=cfg.grpc.history)
        self.loader = BpfLoader()
        self.registry = CollectorRegistry(auto_describe=False)
        self.features: dict[str, dict[str, Any]] = {}
        self.headers: kernel_headers.HeaderTree | None = None
        self.tcp: TcpFlows | None = None
        self.procs: ProcEvents | None = None
        self.http: HttpServer | None = None
        self.devices: CollectorSet | None = None
        self.grpc: GrpcServer | None = None
        self.reporter: Reporter | None = None
        self.watcher: RuntimeWatcher | None = None
        self.cluster: ClusterWatch | None = None
        self.cluster_nets = ClusterNetworks()
        self._policy_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        path = policy_path(cfg)
        try:
            self.policy = PolicyState(path, load_policy(path), _signature(path))
        except PolicyError as exc:
            raise StartupError(f"policy: {exc}") from None

    # -- start-up -----------------------------------------------------------
    def start(self) -> None:
        """Bind the port first (fail fast), then load the programs, then serve."""
        host, port = self.cfg.server.host, self.cfg.server.port
        try:
            self.http = HttpServer(host, port, self.registry)
        except OSError as exc:
            raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        for path, route in {
            "/healthz": self._healthz,
            "/health": self._healthz,
            "/readyz": self._readyz,
            "/ready": self._readyz,
        }.items():
            self.http.add(path, route)
        for collector in (
            CacheCollector(self.cache),
            LoaderCollector(self.loader),
            EventBusCollector(self.bus),
            _AgentCollector(self),
        ):
            self.registry.register(collector)
        self.http.start()
        log.info("lens-ebpf %s serving on %s:%d", __version__, host, self.http.port)

        tracefs.ensure_mounted()
        self.headers = kernel_headers.resolve(
            fallback_glob=self.cfg.kernel.headers_fallback_glob,
            link=self.cfg.kernel.link_headers,
            host_root=Path(self.cfg.kernel.host_root) if self.cfg.kernel.host_root else None,
        )
        log.info(
            "kernel headers: %s %s (%s)",
            self.headers.source,
            self.headers.path,
            self.headers.detail,
        )
        self._start_tcp()
        self._start_processes()
        self._start_kubernetes()
        self._start_devices()
        self._start_grpc()
        self._spawn("reader", self._read_loop)
        self._spawn("policy", self._policy_loop)
        self.ready = True

    def _start_tcp(self) -> None:
        if not self.cfg.collectors.tcp.enabled:
            self.features["tcp_flows"] = {"state": OFF, "reason": "disabled by config"}
            self.features["tcp_rtt"] = {"state": OFF, "reason": "needs the tcp collector"}
            return
        tcp = TcpFlows(
            self.cfg, self.cache, self.bus, self.loader, rtt=self.cfg.collectors.rtt.enabled
        )
        if tcp.start(self._effective(self.policy.policy)):
            self.tcp = tcp
            self.registry.register(TcpFlowsCollector(tcp))
            self._spawn("ringbuf-tcp", lambda: tcp.poll_until(self.stop_event))
        st = self.loader.status.get("tcp_flows")
        if st is not None:
            flows_needs = [n for n in st.paths if n != RTT]
            self.features["tcp_flows"] = feature_view(st, flows_needs)
            # RTT stands on the flows program (it needs each socket's state), whichever
            # path that program's bytes took
            rtt = feature_view(st, [RTT])
            if self.tcp is None or self.tcp.rtt is None:
                reason = tcp.rtt_off_reason or f"needs the tcp_flows program: {st.reason}"
                rtt.update(state=OFF, reason=reason, path=OFF)
            rtt["detail"] = "; ".join(tcp.plan.degraded_for([RTT]))
            self.features["tcp_rtt"] = rtt

    def _start_kubernetes(self) -> None:
        """The pod/service index when an API is configured; standalone otherwise."""
        k = self.cfg.kubernetes
        try:
            api = api_client(k.mode, k.kubeconfig)
        except NotConfigured as exc:
            self.features["kubernetes"] = {"state": OFF, "reason": str(exc)}
            log.info("kubernetes: %s", exc)
            return
        except Exception as exc:  # a configured API that cannot be used: say so, run on
            self.features["kubernetes"] = {"state": "error", "reason": str(exc)}
            log.error("kubernetes: %s; running standalone on the policy", exc)
            return
        self.cluster = ClusterWatch(api, k)
        self.registry.register(ClusterCollector(self.cluster))
        self.cluster.start()
        if self.tcp is not None:
            self.tcp.lookup = self.cluster.index.lookup
        if self.procs is not None:
            self.procs.workload = self.cluster.index.pod
        self.features["kubernetes"] = {"state": RUNNING, "reason": ""}
        if k.cluster_cidrs:
            self._spawn("k8s-cidrs", self._cidr_loop)

    def _cidr_loop(self) -> None:
        assert self.cluster is not None
        while not self.stop_event.is_set():
            nets = self.cluster.networks()
            if (nets.pods, nets.services) != (self.cluster_nets.pods, self.cluster_nets.services):
                self.cluster_nets = nets
                log.info("cluster CIDRs from %s: pods %s, services %s", nets.source or "nowhere",
                         [str(n) for n in nets.pods], [str(n) for n in nets.services])  # fmt: skip
                try:
                    self._apply_policy(self.policy.policy)
                except ValueError as exc:
                    log.error("cluster CIDRs not applied: %s", exc)
            self.stop_event.wait(self.cfg.kubernetes.cidr_refresh_seconds)

    def _effective(self, policy: Policy) -> Policy:
        """The policy with its empty k8sPod/k8sSvc classes taken from the cluster."""
        return with_cluster_networks(policy, self.cluster_nets.pods, self.cluster_nets.services)[0]

    def _apply_policy(self, policy: Policy) -> None:
        with self._policy_lock:
            if self.tcp is not None:
                self.tcp.set_policy(self._effective(policy))

    def _kubernetes_collectors(self, gpu: GpuCollector | None) -> list[Any]:
        """PodResources (GPU -> pod) and the kubelet's allocation and storage figures."""
        k = self.cfg.kubernetes
        out: list[Any] = []
        if k.pod_resources.enabled:
            pr = k.pod_resources
            prc = PodResourcesCollector(pr.interval_seconds, pr.socket, pr.timeout_seconds,
                                        k.kubelet.gpu_resources)  # fmt: skip
            if gpu is not None:
                gpu.allocated = lambda: prc.assigned
            out.append(prc)
            self.features["pod_resources"] = {"state": RUNNING, "reason": ""}
        else:
            self.features["pod_resources"] = {"state": OFF, "reason": "disabled by config"}
        kl = k.kubelet
        if not kl.enabled:
            self.features["kubelet"] = {"state": OFF, "reason": "disabled by config"}
        elif self.cluster is None and not kl.url:
            self.features["kubelet"] = {"state": OFF, "reason": "standalone: no Kubernetes API "
                                        "and no kubernetes.kubelet.url"}  # fmt: skip
        else:
            url = kl.url or f"https://{self.cfg.node.ip or self.cfg.node_name}:10250"
            client = KubeletClient(url, kl.ca_file or SA_CA, kl.token_file,
                                   kl.insecure_skip_verify, kl.timeout_seconds)  # fmt: skip
            out.append(KubeletCollector(kl.interval_seconds, client, self.cfg.node_name,
                                        kl.gpu_resources,
                                        lambda: len(gpu.readings()) if gpu else 0))  # fmt: skip
            self.features["kubelet"] = {"state": RUNNING, "reason": ""}
        return out

    def _start_devices(self) -> None:
        """Device collectors, each switched by collectors.<name>.enabled."""
        chosen = []
        gpu: GpuCollector | None = None
        for name, factory in all_collectors().items():
            if getattr(self.cfg.collectors, name).enabled:
                collector = factory(self.cfg)
                if isinstance(collector, GpuCollector):
                    gpu = collector
                    if self.procs is not None:
                        collector.identify = self._pid_identity
                chosen.append(collector)
                self.features[name] = {"state": RUNNING, "reason": ""}
            else:
                self.features[name] = {"state": OFF, "reason": "disabled by config"}
        chosen.extend(self._kubernetes_collectors(gpu))
        self.devices = CollectorSet(chosen)
        self.registry.register(self.devices)
        self.devices.start()
        assert self.http is not None
        self.http.add("/node", lambda: envelope(self._view("system", "node")))
        self.http.add("/metrics/json", lambda: json_response(200, self._view("system", "system")))
        self.http.add("/rdma", lambda: envelope(self._view("rdma", "rdma") or []))
        self.http.add("/gpus", lambda: envelope(self._view("gpu", "gpus") or []))
        self.http.add("/gpuDriverVersion", lambda: envelope(self._view("gpu", "driver") or ""))
        self.http.add("/cardMetrics", lambda: envelope(self._view("gpu", "cards") or []))
        self.http.add("/driMapping", lambda: envelope(self._view("gpu", "dri") or []))

    def _start_grpc(self) -> None:
        """The event API and, when a collector is configured, the reporter."""
        node = (self.cfg.node_name, self.cfg.node.ip)
        if self.cfg.grpc.enabled:
            t = self.cfg.grpc.tls
            try:
                self.grpc = GrpcServer(
                    self.cfg.grpc.listen, self.bus, node,
                    lambda: {k: v["state"] for k, v in self.features.items()},
                    self.cfg.grpc.subscriber_queue,
                    server_credentials(t.cert, t.key, t.client_ca),
                )  # fmt: skip
            except (OSError, RuntimeError) as exc:
                raise StartupError(f"gRPC: {exc}") from None
            self.grpc.start()
            log.info("gRPC on %s (port %d)", self.cfg.grpc.listen, self.grpc.port)
        if self.cfg.reporter.target:
            r = self.cfg.reporter
            self.reporter = Reporter(
                r.target, self.bus, node, r.buffer,
                channel_credentials(r.tls.ca, r.tls.cert, r.tls.key), r.backoff_max_seconds,
            )  # fmt: skip
            self.reporter.start()

    def _pid_identity(self, pid: int) -> dict[str, str]:
        """Pod identity of a host pid (GPU processes), from its cgroup."""
        assert self.procs is not None
        try:
            text = Path(self.cfg.devices.procfs_root, str(pid), "cgroup").read_text()
        except OSError:
            return {}
        ref = parse_cgroup(cgroup_path(text))
        return identity(ref, self.procs.resolver.containers.get(ref.container_id))

    def _view(self, collector: str, view: str) -> Any:
        c = self.devices.collectors.get(collector) if self.devices else None
        return c.views.get(view) if c is not None else None

    def _spawn(self, name: str, target: Any) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    # -- loops --------------------------------------------------------------
    def _start_processes(self) -> None:
        """exec/exit/OOM attributed to containers; /pods from the runtime's state."""
        if not self.cfg.collectors.processes.enabled:
            self.features["processes"] = {"state": OFF, "reason": "disabled by config"}
            return
        resolver = ContainerResolver(
            CgroupIndex.for_host(Path(self.cfg.devices.procfs_root)),
            ContainerdState(Path(self.cfg.containers.containerd_state),
                            Path(self.cfg.devices.sysfs_root)),
        )  # fmt: skip
        procs = ProcEvents(self.cfg, self.cache, self.bus, self.loader, resolver)
        if procs.start():
            self.procs = procs
            try:
                self.watcher = RuntimeWatcher(Path(self.cfg.containers.containerd_state),
                                              resolver.refresh)  # fmt: skip
                self.watcher.start()
            except OSError as exc:  # read cycles still find containers, a little later
                log.warning("no inotify on the containerd state: %s", exc)
            self.registry.register(ProcEventsCollector(procs))
            self._spawn("ringbuf-proc", lambda: procs.poll_until(self.stop_event))
        self.features["processes"] = feature_view(self.loader.status[NAME_PROCS])
        assert self.http is not None
        self.http.add(
            "/pods",
            lambda: envelope(pods_view(self.procs.resolver.containers if self.procs else {})),
        )

    def _read_loop(self) -> None:
        interval = self.cfg.bpf.read_interval_seconds
        next_sweep = time.monotonic() + self.cfg.bpf.reconcile_interval_seconds
        while not self.stop_event.is_set():
            try:
                if self.tcp is not None:
                    if time.monotonic() >= next_sweep:
                        self.tcp.reconcile()
                        next_sweep = time.monotonic() + self.cfg.bpf.reconcile_interval_seconds
                    self.tcp.read()
                if self.procs is not None:
                    self.procs.read()
                self.heartbeat = time.monotonic()
            except Exception:
                log.exception("reading BPF maps failed")
            self.stop_event.wait(interval)

    def _policy_loop(self) -> None:
        interval = self.cfg.policy.watch_interval_seconds
        while not self.stop_event.is_set():
            changed = _signature(self.policy.path) != self.policy.signature
            if self.reload_event.is_set() or changed:
                self.reload_event.clear()
                self.reload_policy("SIGHUP" if not changed else "file changed")
            self.stop_event.wait(interval)

    def reload_policy(self, why: str) -> bool:
        """Load the policy again; on error keep the last good one and say why."""
        state = self.policy
        state.signature = _signature(state.path)
        try:
            policy = load_policy(state.path)
            self._apply_policy(policy)
        except (PolicyError, ValueError) as exc:
            state.last_error = str(exc)
            state.reloads["failure"] += 1
            log.error("policy reload (%s) failed, keeping the last good policy: %s", why, exc)
            return False
        state.policy = policy
        state.last_error = ""
        state.reloads["success"] += 1
        log.info("policy reloaded (%s) from %s", why, state.path)
        return True

    # -- HTTP ---------------------------------------------------------------
    def _healthz(self) -> Response:
        stale = time.monotonic() - self.heartbeat > 3 * self.cfg.bpf.read_interval_seconds + 10
        if stale:
            return json_response(503, {"status": "reader stalled"})
        return json_response(200, {"status": "ok"})

    def _readyz(self) -> Response:
        body = {
            "ready": self.ready,
            "version": __version__,
            "features": self.features,
            "policy": {
                "path": str(self.policy.path),
                "error": self.policy.last_error,
                "reloads": self.policy.reloads,
            },
            "kernel_headers": (
                {"source": self.headers.source, "path": self.headers.path} if self.headers else None
            ),
            "kubernetes": self._kubernetes_status(),
        }
        return json_response(200 if self.ready else 503, body)

    def _kubernetes_status(self) -> dict[str, Any] | None:
        if self.cluster is None:
            return None
        nets = self.cluster_nets
        filled = with_cluster_networks(self.policy.policy, nets.pods, nets.services)[1]
        return {
            "watches": {r.resource: {"connected": r.connected, "synced": r.synced.is_set(),
                                     "resource_version": r.resource_version,
                                     "last_error": r.last_error}
                        for r in self.cluster.reflectors},
            "index": self.cluster.index.counts(),
            "cluster_cidrs": {"source": nets.source, "pods": [str(n) for n in nets.pods],
                              "services": [str(n) for n in nets.services],
                              "policy_classes_filled": filled},
        }  # fmt: skip

    # -- shutdown -----------------------------------------------------------
    def install_signals(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.stop_event.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop_event.set())
        signal.signal(signal.SIGHUP, lambda *_: self.reload_event.set())

    def wait(self) -> None:
        while not self.stop_event.wait(1.0):
            pass

    def stop(self) -> None:
        """Detach every program and stop serving."""
        if self.http is None and not self.loader.status:
            return  # nothing was started
        self.stop_event.set()
        for t in self._threads:
            t.join(timeout=5)
        if self.watcher is not None:
            self.watcher.stop()
        if self.cluster is not None:
            self.cluster.stop()
        if self.reporter is not None:
            self.reporter.stop()
        if self.grpc is not None:
            self.grpc.stop()
        if self.devices is not None:
            self.devices.stop()
        self.loader.close()
        for name, st in self.loader.status.items():
            self.features.setdefault(name, {}).update(state=st.state, reason=st.reason)
        if self.http is not None:
            self.http.stop()
        log.info("lens-ebpf stopped; all BPF programs detached")


class _AgentCollector(Collector):
    """Agent-level self metrics: build info, features, policy reloads."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        a = self._agent
        info = Metric("lens_agent_build_info", "Agent version", "gauge")
        info.add_sample("lens_agent_build_info", {"version": __version__}, 1)
        yield info
        feat = Metric("lens_agent_feature_up", "1 when a feature is running", "gauge")
        for name, f in a.features.items():
            feat.add_sample(
                "lens_agent_feature_up",
                # path: tracepoint or kprobe for BPF features; "" for the others
                {"feature": name, "path": f.get("path", "")},
                1 if f["state"] in (ATTACHED, RUNNING) else 0,
            )
        yield feat
        if a.reporter is not None:
            r = a.reporter
            for name, kind, value in (
                ("lens_agent_reporter_sent_total", "counter", r.sent),
                ("lens_agent_reporter_lost_total", "counter", r.lost),
                ("lens_agent_reporter_acked_seq", "gauge", r.acked),
                ("lens_agent_reporter_connected", "gauge", 1 if r.connected else 0),
                ("lens_agent_reporter_reconnects_total", "counter", r.reconnects),
            ):
                m = Metric(name.removesuffix("_total"), "Event reporter", kind)
                m.add_sample(name, {}, value)
                yield m
        reloads = Metric("lens_agent_policy_reloads", "Policy reloads by result", "counter")
        for result, n in a.policy.reloads.items():
            reloads.add_sample("lens_agent_policy_reloads_total", {"result": result}, n)
        yield reloads
        err = Metric("lens_agent_policy_error", "1 while the last policy reload failed", "gauge")
        err.add_sample("lens_agent_policy_error", {}, 1 if a.policy.last_error else 0)
        yield err


def run_agent(cfg: Config) -> int:
    """Run until SIGTERM or SIGINT; 0 on a clean stop."""
    agent = Agent(cfg)
    agent.install_signals()
    try:
        agent.start()
    except StartupError:
        agent.stop()
        raise
    if os.geteuid() != 0:
        log.warning("not running as root: BPF programs need CAP_BPF and CAP_PERFMON")
    agent.wait()
    agent.stop()
    return 0
