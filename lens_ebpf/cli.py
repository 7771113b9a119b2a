"""lens-ebpf command line: run, check, version."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from typing import Any

from lens_ebpf import __version__, config

log = logging.getLogger("lens_ebpf.agent")

EXAMPLES = """\
examples:
  lens-ebpf run                                  # agent on :9470, shipped policy
  lens-ebpf run --listen 127.0.0.1:9470 --policy /etc/lens/policy.yaml
  lens-ebpf run --config lens.yaml --no-collector.tcp
  lens-ebpf check                                # what this node supports, and why not
  lens-ebpf check --json                         # the same for tools
  lens-ebpf trace tcp --port 443                 # live flows, no agent needed (root)
"""


def collectors() -> list[str]:
    """collectors.<key> sections that can be switched off (--no-collector.<key>)."""
    from lens_ebpf.feature import collector_settings

    return [k for k, m in collector_settings().items() if "enabled" in m.model_fields]


class CliError(Exception):
    """A usage problem, worded for one line."""


def parse_listen(value: str) -> tuple[str, int]:
    """HOST:PORT, [V6]:PORT or :PORT."""
    try:
        return config.split_listen(value)
    except ValueError as exc:
        raise CliError(f"--listen {value!r}: {exc}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lens-ebpf",
        description="eBPF observability agent for Kubernetes GPU nodes",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="run the agent",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--config", help="YAML config file (also LENS_CONFIG)")
    run.add_argument("--policy", help="policy.yaml (default: the shipped policy)")
    run.add_argument("--listen", help="HOST:PORT for HTTP (default 0.0.0.0:9470)")
    run.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    run.add_argument("--tuner", action="store_true",
                     help="turn the system tuner on (collectors.tuner.enabled): it raises "
                     "kernel settings that are lower than collectors.tuner asks")  # fmt: skip
    for name in collectors():
        run.add_argument(
            f"--no-collector.{name}",
            dest=f"no_collector_{name}",
            action="store_true",
            help=f"disable the {name} collector",
        )
    from lens_ebpf import trace

    trace.add_parser(sub)
    check = sub.add_parser("check", help="report what this kernel and node support")
    check.add_argument("--json", action="store_true", help="one JSON object")
    check.add_argument("--config", help="YAML config file (also LENS_CONFIG): the tuner's "
                       "settings to compare with this node's")  # fmt: skip
    sub.add_parser("version", help="print the version")
    col = sub.add_parser("collect", help="reference collector for the event reporter")
    col.add_argument("--listen", default="0.0.0.0:9472", help="HOST:PORT (default 0.0.0.0:9472)")
    col.add_argument("--out", help="append JSON lines here (default: stdout)")
    col.add_argument("--tls-cert", default="")
    col.add_argument("--tls-key", default="")
    col.add_argument("--tls-client-ca", default="", help="require client certificates (mTLS)")
    rec = sub.add_parser(
        "recorder",
        help="record GPU pods and their workloads in a database (one per cluster)",
        epilog=RECORDER_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rec.add_argument("--config", help="YAML config file (also LENS_CONFIG): the recorder: section")
    rec.add_argument("--database", help="SQLAlchemy URL (recorder.database_url)")
    rec.add_argument("--listen", help="HOST:PORT for REST and /metrics (default 0.0.0.0:9480)")
    rec.add_argument("--collect-listen", help="HOST:PORT for reporters (default 0.0.0.0:9472)")
    rec.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    rec.add_argument("--report", action="store_true",
                     help="print the workloads that used GPUs since --since and exit")  # fmt: skip
    rec.add_argument("--since", default="7d", help="with --report: RFC 3339, or an age (12h, 7d)")
    rec.add_argument("--node", default="", help="with --report: only GPU pods on this node")
    rec.add_argument("--json", action="store_true", help="with --report: one object per line")
    rec.add_argument("--remove-finalizers", action="store_true",
                     help="take the recorder's finalizer off every object and exit "
                     "(run before uninstalling)")  # fmt: skip
    return parser


RECORDER_EXAMPLES = """\
examples:
  lens-ebpf recorder                                   # SQLite file ./lens-recorder.db
  lens-ebpf recorder --database postgresql+psycopg://lens:secret@db:5432/lens
  lens-ebpf recorder --report --since 7d --node gpu-node-3
  lens-ebpf recorder --remove-finalizers               # before uninstalling it
"""


def _recorder_overrides(args: argparse.Namespace) -> dict[tuple[str, ...], Any]:
    out: dict[tuple[str, ...], Any] = {}
    if args.database:
        out[("recorder", "database_url")] = args.database
    for flag, key in ((args.listen, "listen"), (args.collect_listen, "collect_listen")):
        if flag:
            parse_listen(flag)
            out[("recorder", key)] = flag
    if args.log_level:
        out[("log_level",)] = args.log_level
    return out


def _cmd_recorder(args: argparse.Namespace) -> int:
    from lens_ebpf.k8s.cluster import NotConfigured, api_client
    from lens_ebpf.recorder import service
    from lens_ebpf.recorder.queries import QueryError
    from lens_ebpf.recorder.store import DatabaseError

    cfg = config.load(args.config, overrides=_recorder_overrides(args))
    logging.basicConfig(level=cfg.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    try:
        if args.report:
            print(service.run_report(cfg, args.since, args.node, args.json))
            return 0
        try:
            client = api_client(cfg.kubernetes.mode, cfg.kubernetes.kubeconfig)
        except NotConfigured as exc:
            raise CliError(f"recorder: needs the Kubernetes API ({exc})") from None
        except ValueError as exc:
            raise CliError(f"recorder: {exc}") from None
        if args.remove_finalizers:
            for kind, n in sorted(service.remove_finalizers(cfg, client).items()):
                print(f"{kind}: {n} finalizers removed")
            return 0
        app = service.RecorderApp(cfg, client)
    except CliError:
        raise
    except (DatabaseError, QueryError) as exc:
        raise CliError(f"recorder: {exc}") from None
    except Exception as exc:  # the database or the API at start-up
        raise CliError(f"recorder: cannot start: {type(exc).__name__}: {exc}"[:500]) from None
    import signal

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        app.start()
    except OSError as exc:
        app.stop(flush_timeout=1)
        raise CliError(f"recorder: {exc}") from None
    log.info("recorder: schema %s, REST on %s, collector on %s", app.revision,
             cfg.recorder.listen, cfg.recorder.collect_listen or "off")  # fmt: skip
    while not stop.wait(1.0):
        pass
    app.stop()
    return 0


def _overrides(args: argparse.Namespace) -> dict[tuple[str, ...], Any]:
    out: dict[tuple[str, ...], Any] = {}
    if args.policy:
        out[("policy", "path")] = args.policy
    if args.listen:
        host, port = parse_listen(args.listen)
        out[("server", "host")] = host
        out[("server", "port")] = port
    if args.log_level:
        out[("log_level",)] = args.log_level
    if args.tuner:
        out[("collectors", "tuner", "enabled")] = True
    for name in collectors():
        if getattr(args, f"no_collector_{name}"):
            out[("collectors", name, "enabled")] = False
    return out


def run_agent(cfg: config.Config) -> int:
    """Run until SIGTERM or SIGINT; 0 on a clean stop."""
    from lens_ebpf.agent import Agent, StartupError

    agent = Agent(cfg)
    agent.install_signals()
    try:
        agent.start()
    except StartupError:
        agent.stop()
        raise
    if os.geteuid() != 0:
        log.warning("not running as root: BPF programs need CAP_BPF and CAP_PERFMON")
    while not agent.stop_event.wait(1.0):
        pass
    agent.stop()
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from lens_ebpf.agent import StartupError

    cfg = config.load(args.config, overrides=_overrides(args))
    logging.basicConfig(
        level=cfg.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return run_agent(cfg)
    except StartupError as exc:
        raise CliError(str(exc)) from None


def _cmd_check(args: argparse.Namespace) -> int:
    from lens_ebpf import probe

    result = probe.run_checks(config.load(args.config))
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(probe.format_table(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "version":
            print(f"lens-ebpf {__version__}")
            return 0
        if args.command == "check":
            return _cmd_check(args)
        if args.command == "collect":
            from lens_ebpf.api import collector_server, grpc_server

            creds = grpc_server.server_credentials(args.tls_cert, args.tls_key, args.tls_client_ca)
            try:
                return collector_server.serve(args.listen, args.out, creds)
            except OSError as exc:
                raise CliError(f"collect: {exc}") from None
        if args.command == "recorder":
            return _cmd_recorder(args)
        if args.command == "trace":
            from lens_ebpf import trace

            try:
                return trace.run(args)
            except trace.TraceError as exc:
                raise CliError(f"trace: {exc}") from None
        return _cmd_run(args)
    except (CliError, config.ConfigError) as exc:
        print(f"lens-ebpf: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
