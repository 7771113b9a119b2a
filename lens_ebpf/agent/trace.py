"""`lens-ebpf trace tcp|rtt|exec|all|gpu|drop`: live events from the agent's own programs.

Runs standalone as root, with no agent and no Kubernetes. The programs, decoders and
attribution are the agent's; pid and port filters are applied in the kernel (the
programs' trace_filter map), the others in user space. `trace gpu` shows GPU faults
(Xid, uncorrectable ECC and RAS errors) as the agent sees them: the kernel log, NVML's
events and the error counters, with the pod that held the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from lens_ebpf.agent import config, kernel_headers, tracefs
from lens_ebpf.agent.bpf import btf, layouts
from lens_ebpf.agent.bpf.loader import BpfLoader, plan_for, program_source, render_cflags
from lens_ebpf.agent.drops import drops, reasons
from lens_ebpf.agent.enrich import Enrichment
from lens_ebpf.agent.events import Event, EventBus, EventFilter, Subscription
from lens_ebpf.agent.metrics.cache import MetricCache
from lens_ebpf.agent.net.policy import PolicyError
from lens_ebpf.agent.net.policy_watch import PolicyWatcher
from lens_ebpf.agent.processes import proc_events
from lens_ebpf.agent.tcp import tcp_flows, tcp_rtt
from lens_ebpf.agent.trace_format import (
    ALL_HEADER,
    DROP_HEADER,
    EXEC_HEADER,
    GPU_HEADER,
    TCP_HEADER,
    format_any,
    format_drop,
    format_flow,
    format_gpu,
    format_proc,
    rtt_lines,
)
from lens_ebpf.core.runner import Job, Runner

EXAMPLES = """\
examples:
  lens-ebpf trace tcp                      # one line per closed TCP flow
  lens-ebpf trace tcp --port 443 --json    # flows on port 443, one JSON object per line
  lens-ebpf trace rtt 5 3                  # RTT histograms per class, 3 times every 5 s
  lens-ebpf trace exec --pod web-0         # execs and exits in one pod's containers
  lens-ebpf trace all --duration 10        # everything, for 10 seconds
  lens-ebpf trace gpu --wide               # GPU faults and the pods on the GPU
  lens-ebpf trace drop --port 8080         # each packet the kernel drops, and why
"""


class TraceError(Exception):
    """Why trace cannot run, in one line (exit status 2)."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "trace",
        help="live events from this node's kernel",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("what", choices=("tcp", "rtt", "exec", "all", "gpu", "drop"))
    p.add_argument(
        "interval",
        nargs="?",
        type=float,
        default=5.0,
        help="rtt: seconds between histograms (default 5)",
    )
    p.add_argument("count", nargs="?", type=int, default=0, help="rtt: how many (default: ever)")
    p.add_argument("--pid", type=int, default=0, help="this process (exec: or its children)")
    p.add_argument("--comm", help="process name")
    p.add_argument("--port", type=int, default=0, help="local or remote TCP port")
    p.add_argument("--class", dest="cls", help="remote class (k8sPod, externalHosts, ...)")
    p.add_argument("--container", help="container name or id prefix")
    p.add_argument("--namespace", help="pod namespace")
    p.add_argument("--pod", help="pod name")
    p.add_argument("--duration", type=float, default=0, help="stop after S seconds")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--wide", action="store_true", help="add pod and container columns")
    p.add_argument("--policy", help="policy.yaml for classes (default: the shipped one)")
    p.add_argument("--config", help="agent config file (map sizes, containerd state dir)")
    p.add_argument("--ebpf", action="store_true", help=argparse.SUPPRESS)


def event_filter(args: argparse.Namespace, kinds: frozenset[str] = frozenset()) -> EventFilter:
    """The filters the kernel did not apply (the one filter gRPC Subscribe uses too)."""
    return EventFilter(
        kinds=kinds,
        namespace=args.namespace or "",
        pod=args.pod or "",
        container=args.container or "",
        comm=args.comm or "",
        cls=args.cls or "",
    )


def rtt_by_class(cache: MetricCache) -> dict[tuple[str, str], tuple[list[int], float]]:
    out: dict[tuple[str, str], tuple[list[int], float]] = {}
    for labels, (bins, total) in cache.snapshot_family(tcp_rtt.LENS):
        key = (labels[0], labels[1])
        acc, s = out.get(key, ([0] * len(bins), 0.0))
        out[key] = ([a + b for a, b in zip(acc, bins, strict=True)], s + total)
    return out


def print_ebpf(what: str, cfg: config.Config, out: TextIO) -> None:
    """The C source and cflags trace would load (hidden --ebpf)."""
    names = {
        "tcp": ["tcp_flows"],
        "rtt": ["tcp_flows"],
        "exec": ["proc_events"],
        "all": ["tcp_flows", "proc_events"],
        "drop": ["drops"],
    }[what]
    for name in names:
        # the switches this kernel's spec resolution sets, then the settings
        if name == "tcp_flows":
            rtt = what in ("rtt", "all")
            plan = plan_for(tcp_flows.SPEC, () if rtt else (tcp_flows.RTT,))
            rtt = rtt and plan.uses(tcp_flows.RTT)
            settings = tcp_flows.TcpFlows.static_defines(cfg.bpf, rtt=rtt)
        elif name == "drops":
            plan = plan_for(drops.SPEC)
            kernel_btf = btf.running()
            settings = drops.Drops.static_defines(cfg.bpf, 4096, reasons.reason_names(kernel_btf))
        else:
            plan = plan_for(proc_events.SPEC)
            settings = proc_events.ProcEvents.static_defines(cfg.bpf)
        defines: dict[str, int | str] = {**plan.defines, **settings}
        out.write(f"// {program_source(name)}\n// cflags: {' '.join(render_cflags(defines))}\n")
        out.write(program_source(name).read_text())


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    cfg = config.load(args.config, overrides={("log_level",): "error"})
    if args.what == "gpu":
        return run_gpu(args, cfg, out, err)
    if args.what == "drop" and not args.ebpf:
        return run_drop(args, cfg, out, err)
    if args.ebpf:
        print_ebpf(args.what, cfg, out)
        return 0
    if os.geteuid() != 0:
        raise TraceError("needs root: loading BPF programs takes CAP_BPF and CAP_PERFMON")
    if tracefs.ensure_mounted() is None:
        raise TraceError("tracefs is not mounted and cannot be (mount -t tracefs ...)")
    want_tcp = args.what in ("tcp", "rtt", "all")
    want_proc = args.what in ("exec", "all")
    # what this kernel lacks, said before anything compiles (the specs' own reasons)
    if want_tcp:
        plan = plan_for(tcp_flows.SPEC)
        if not plan.loadable:
            raise TraceError(f"tcp_flows: {plan.off_reason}")
        if args.what == "rtt" and not plan.uses(tcp_flows.RTT):
            raise TraceError(f"rtt: {plan.choices[tcp_flows.RTT].reason}")
    if want_proc and not (plan := plan_for(proc_events.SPEC)).loadable:
        raise TraceError(f"proc_events: {plan.off_reason}")
    kernel_headers.for_config(cfg.kernel)
    try:
        policy = PolicyWatcher(Path(args.policy) if args.policy else config.policy_path(cfg))
    except PolicyError as exc:
        raise TraceError(f"policy: {exc}") from None
    # pid -> container -> pod from the runtime; no cluster index (standalone)
    enrich = Enrichment.for_node(Path("/proc"), Path("/sys"), Path(cfg.containers.containerd_state))

    cache = MetricCache(ttl_seconds=3600, max_series=10**6)
    bus = EventBus(cfg.events.queue_size)
    loader = BpfLoader()
    programs: list[Any] = []
    tcp = procs = None
    if want_tcp:
        rtt_every = getattr(cfg.collectors.section("rtt"), "sample_seconds", tcp_rtt.SAMPLE_SECONDS)
        tcp = tcp_flows.TcpFlows(
            cfg.bpf,
            cfg.events,
            cache,
            bus,
            loader,
            rtt=args.what in ("rtt", "all"),
            enrich=enrich,
            rtt_sample_seconds=rtt_every,
        )
        if args.what == "rtt" and tcp.rtt is None:
            raise TraceError(f"rtt: {tcp.rtt_off_reason}")
        if not tcp.start(policy.effective()):
            raise TraceError(f"tcp_flows: {loader.status['tcp_flows'].reason}")
        layouts.set_trace_filter(tcp.bpf, args.pid, args.port)
        programs.append(tcp)
    if want_proc:
        procs = proc_events.ProcEvents(cfg.bpf, cache, bus, loader, enrich)
        if not procs.start():
            loader.close()
            raise TraceError(f"proc_events: {loader.status['proc_events'].reason}")
        layouts.set_trace_filter(procs.bpf, args.pid)
        programs.append(procs)

    kinds = set()
    if args.what in ("tcp", "all"):
        kinds.add("flow_closed")
    if want_proc:
        kinds |= {"process_exec", "process_exit", "oom_kill"}
    sub = bus.subscribe("trace", accept=event_filter(args, frozenset(kinds)))
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threads = [
        threading.Thread(target=p.poll_until, args=(stop, 100), daemon=True) for p in programs
    ]
    for t in threads:
        t.start()
    err.write(f"lens-ebpf trace: tracing {args.what} (Ctrl-C to stop)\n")
    err.flush()
    try:
        shown = _show(args, sub, tcp, cache, stop, out)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=2)
        for p in programs:
            p.read()
        lost = sum(p.kernel_stats["ringbuf_full"] for p in programs) + sub.dropped
        received = sum(p.events_received for p in programs)
        loader.close()
    err.write(f"lens-ebpf trace: {shown} events shown, {received} received, {lost} lost\n")
    return 0


def _show(
    args: argparse.Namespace,
    sub: Subscription,
    tcp: tcp_flows.TcpFlows | None,
    cache: MetricCache,
    stop: threading.Event,
    out: TextIO,
) -> int:
    """Each event as it comes, and rtt's histograms every interval, until stopped, the
    duration is over or count histograms were shown; how many events were shown."""
    boot_offset = time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)
    shown = 0
    header_done = False
    started = time.monotonic()
    next_rtt = started + args.interval
    rtt_prev: dict[tuple[str, str], list[int]] = {}
    rtt_rounds = 0
    while not stop.is_set():
        if args.duration and time.monotonic() - started >= args.duration:
            break
        ev = sub.get(timeout=0.1)
        if ev is not None:
            if not args.json and not header_done:
                out.write(
                    {"tcp": TCP_HEADER, "exec": EXEC_HEADER}.get(args.what, ALL_HEADER) + "\n"
                )
                header_done = True
            out.write(_render(ev, args, boot_offset) + "\n")
            out.flush()
            shown += 1
        if args.what in ("rtt", "all") and tcp is not None and time.monotonic() >= next_rtt:
            tcp.read()
            now = rtt_by_class(cache)
            for line in rtt_lines(rtt_prev, now, time.strftime("%H:%M:%S"), args.json):
                out.write(line + "\n")
            out.flush()
            rtt_prev = {k: v[0] for k, v in now.items()}
            next_rtt += args.interval
            rtt_rounds += 1
            if args.count and rtt_rounds >= args.count:
                break
    return shown


def _render(ev: Event, args: argparse.Namespace, boot_offset: float) -> str:
    if args.json:
        return json.dumps(ev.to_dict(), sort_keys=True, default=str)
    if args.what == "all":
        return format_any(ev, boot_offset, args.wide)
    if ev["kind"] == "flow_closed":
        return format_flow(ev, boot_offset, args.wide)
    return format_proc(ev, boot_offset, args.wide)


def run_gpu(args: argparse.Namespace, cfg: config.Config, out: TextIO, err: TextIO) -> int:
    """GPU faults as the agent's GPU feature sees them, without the agent."""
    from lens_ebpf.agent.devices.gpu import collector as gpu_collector
    from lens_ebpf.agent.pods.podresources import PodResourcesCollector

    g = cfg.collectors.section("gpu")
    assert isinstance(g, gpu_collector.GpuSettings)
    sysfs = Path(cfg.devices.sysfs_root)
    enrich = Enrichment.for_node(Path("/proc"), sysfs, Path(cfg.containers.containerd_state))
    k = cfg.kubernetes
    pods = PodResourcesCollector.from_config(k)
    gpus = gpu_collector.make_collector(
        cfg.devices, cfg.node_name, g, enrich.pid, lambda: pods.assigned
    )
    bus = EventBus(cfg.events.queue_size)
    gpus.publish = bus.publish
    sub = bus.subscribe("trace", accept=event_filter(args, frozenset({"gpu_fault"})))
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if k.pod_resources.enabled and Path(k.pod_resources.socket).exists():
        pods.run_once()
    gpus.run_once()

    # the error counters: a rise between readings is a fault
    runner = Runner(
        [Job("gpu", g.interval_seconds, gpus.run_once, leader_only=False)], name="trace"
    )
    threads = []
    kmsg, xids = gpu_collector.fault_watchers(g, gpus)
    if kmsg is not None:
        try:  # opened here, to say so when it cannot be (the agent logs it)
            fd = kmsg.open()
            threads.append(threading.Thread(target=kmsg.run, args=(stop, fd), daemon=True))
        except OSError as exc:
            err.write(f"lens-ebpf trace: {g.kmsg}: {exc.strerror}; kernel log faults not seen\n")
    if xids is not None:
        threads.append(threading.Thread(target=xids.run, args=(stop,), daemon=True))
    for t in threads:
        t.start()
    runner.start()
    gpu_count = len(gpus.readings())
    err.write(f"lens-ebpf trace: tracing GPU faults on {gpu_count} GPUs (Ctrl-C to stop)\n")
    err.flush()
    shown = 0
    started = time.monotonic()
    try:
        while not stop.is_set():
            if args.duration and time.monotonic() - started >= args.duration:
                break
            ev = sub.get(timeout=0.1)
            if ev is None:
                continue
            if not args.json and not shown:
                out.write(GPU_HEADER + "\n")
            out.write(
                (
                    json.dumps(ev.to_dict(), sort_keys=True, default=str)
                    if args.json
                    else format_gpu(ev, args.wide)
                )
                + "\n"
            )
            out.flush()
            shown += 1
    finally:
        stop.set()
        runner.stop(timeout=2)
        for t in threads:
            t.join(timeout=2)
    err.write(f"lens-ebpf trace: {shown} GPU faults shown\n")
    return 0


def run_drop(args: argparse.Namespace, cfg: config.Config, out: TextIO, err: TextIO) -> int:
    """Each packet the kernel drops, while the trace runs (the drops program's records_on):
    pid and port filtered in the kernel, class and comm here. Standalone there is no
    cluster index, so drops name addresses, not pods."""
    if os.geteuid() != 0:
        raise TraceError("needs root: loading BPF programs takes CAP_BPF and CAP_PERFMON")
    if tracefs.ensure_mounted() is None:
        raise TraceError("tracefs is not mounted and cannot be (mount -t tracefs ...)")
    if args.namespace or args.pod or args.container:
        # a drop happens in a softirq as often as in its process: its pod is known from
        # the cluster index (the agent's metrics), not from the process trace sees
        raise TraceError(
            "drop: --namespace, --pod and --container need the agent's cluster "
            "index; filter by --port, --pid or --class"
        )
    if not (plan := plan_for(drops.SPEC)).loadable:
        raise TraceError(f"drops: {plan.off_reason}")
    kernel_headers.for_config(cfg.kernel)
    try:
        policy = PolicyWatcher(Path(args.policy) if args.policy else config.policy_path(cfg))
    except PolicyError as exc:
        raise TraceError(f"policy: {exc}") from None
    loader = BpfLoader()
    prog = drops.Drops(
        cfg.bpf, MetricCache(ttl_seconds=3600, max_series=10**5), loader, listen=False
    )
    if not prog.start(policy.effective()):
        raise TraceError(f"drops: {loader.status['drops'].reason}")
    shown: list[int] = [0]
    boot_offset = time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)

    def show(rec: bytes) -> None:
        prog.events_received += 1
        ev = drops.drop_record(rec, prog.names, prog.has_reasons, prog.labels.locations)
        if (args.cls and ev["class"] != args.cls) or (args.comm and ev["comm"] != args.comm):
            return
        if not args.json and not shown[0]:
            out.write(DROP_HEADER + "\n")
        out.write(
            (json.dumps(ev, sort_keys=True) if args.json else format_drop(ev, boot_offset)) + "\n"
        )
        out.flush()
        shown[0] += 1

    prog.open_events(b"drop_events", show, cfg.bpf.ring_reader)
    layouts.set_trace_filter(prog.bpf, args.pid, args.port)
    prog.set_records(True)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    err.write("lens-ebpf trace: tracing drop (Ctrl-C to stop)\n")
    err.flush()
    started = time.monotonic()
    try:
        while not stop.is_set():
            if args.duration and time.monotonic() - started >= args.duration:
                break
            prog.poll(100)
    finally:
        prog.set_records(False)
        prog.poll(0)
        prog.read_stats(b"stats")
        lost = prog.kernel_stats["ringbuf_full"]
        loader.close()
    err.write(
        f"lens-ebpf trace: {shown[0]} events shown, {prog.events_received} received, "
        f"{lost} lost\n"
    )
    return 0
