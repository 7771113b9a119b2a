"""The recorder's command line: `lens-ebpf recorder` (and `lens-ebpf-recorder`; `lens-ebpf-cluster`
is its old name, kept)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import Any

from lens_ebpf.core.commandline import CliError, parse_listen, run_command
from lens_ebpf.recorder import config

log = logging.getLogger("lens_ebpf.recorder")

EXAMPLES = """\
examples:
  lens-ebpf recorder                                   # SQLite file ./lens-recorder.db
  lens-ebpf recorder --database postgresql+psycopg://lens:secret@db:5432/lens
  lens-ebpf recorder --report --since 7d --node gpu-node-3
  lens-ebpf recorder --remove-finalizers               # before uninstalling it
  lens-ebpf recorder report --week 2026-W47 --format pdf -o week47.pdf
"""

REPORT_EXAMPLES = """\
examples:
  lens-ebpf recorder report                            # last week's, HTML on stdout
  lens-ebpf recorder report --week 2026-W47 --format pdf -o week47.pdf
  lens-ebpf recorder report --week 2026-W48 --format json --cluster x-flannel \\
      --database postgresql+psycopg://lens:secret@db:5432/lens
"""


def build_parser(prog: str = "lens-ebpf recorder") -> argparse.ArgumentParser:
    rec = argparse.ArgumentParser(
        prog=prog,
        description="the recorder: GPU pods and their workloads in a database, the "
        "node agents' events, REST (one per cluster)",
        epilog=EXAMPLES,
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
    rec.add_argument("--cluster", default="",
                     help="with --report: this cluster (not the home one)")  # fmt: skip
    rec.add_argument("--json", action="store_true", help="with --report: one object per line")
    rec.add_argument("--remove-finalizers", action="store_true",
                     help="take the recorder's finalizer off every object and exit "
                     "(run before uninstalling)")  # fmt: skip
    sub = rec.add_subparsers(dest="command", metavar="{report}",
                             help="report: the weekly GPU utilization report of a week; "
                             "none: run the service")  # fmt: skip
    rep = sub.add_parser("report", help="the weekly GPU utilization report of a week",
                         epilog=REPORT_EXAMPLES,
                         formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    rep.add_argument("--week", default="",
                     help="an ISO week, 2026-W47 (default: the last completed one; the "
                     "current one: up to now)")  # fmt: skip
    rep.add_argument("--format", choices=("html", "pdf", "json"), default="html")
    rep.add_argument("-o", "--output", default="-", help="the file to write (default stdout)")
    rep.add_argument("--cluster", dest="report_cluster", default="",
                     help="this cluster (default recorder.cluster_name)")  # fmt: skip
    # also after the subcommand; absent there, the recorder's own flags stand
    for flag, text in (("--config", "YAML config file (also LENS_CONFIG)"),
                       ("--database", "SQLAlchemy URL (recorder.database_url)")):  # fmt: skip
        rep.add_argument(flag, default=argparse.SUPPRESS, help=text)
    return rec


def weekly_report(cfg: config.Config, args: argparse.Namespace) -> bytes:
    """`recorder report`: the week's report from the database and Prometheus, as a file."""
    from datetime import UTC, datetime
    from pathlib import Path

    from lens_ebpf.recorder.errors import BadRequest, Unavailable
    from lens_ebpf.recorder.prom import Prom
    from lens_ebpf.recorder.reports import week, weekly
    from lens_ebpf.recorder.scope import Scope
    from lens_ebpf.recorder.store.writer import engine_for

    r = cfg.recorder
    now = datetime.now(UTC)
    url = r.database_url
    path = url.removeprefix("sqlite:///")
    if url.startswith("sqlite:///") and not Path(path).exists():
        raise CliError(f"recorder report: no recorder database at {path}")
    cluster = args.report_cluster or r.cluster_name
    prom_url = cfg.clusters[cluster].prometheus_url if cluster in cfg.clusters else ""
    p = r.prometheus
    scope = Scope(cluster, Prom(prom_url or p.url, p.timeout_seconds, p.max_points))
    try:
        wk = (week.parse(args.week, r.reports.timezone) if args.week
              else week.containing(now, r.reports.timezone).before())  # fmt: skip
        engine = engine_for(url)
        try:
            chromium = r.reports.chromium if args.format == "pdf" else None
            with engine.connect() as conn:
                made = weekly.make(conn, scope, wk, now, weekly.options(r), chromium)
        finally:
            engine.dispose()
    except (BadRequest, Unavailable) as exc:
        raise CliError(f"recorder report: {exc}") from None
    if args.format == "pdf":
        if made.pdf is None:
            raise CliError(f"recorder report: {made.error}")
        return made.pdf
    return made.json() if args.format == "json" else made.html.encode()


def overrides(args: argparse.Namespace) -> dict[tuple[str, ...], Any]:
    out: dict[tuple[str, ...], Any] = {}
    if args.database:
        out[("recorder", "database_url")] = args.database
    for flag, key in ((args.listen, "listen"), (args.collect_listen, "collect_listen")):
        if flag:
            parse_listen(flag, f"--{key.replace('_', '-')}")
            out[("recorder", key)] = flag
    if args.log_level:
        out[("log_level",)] = args.log_level
    return out


def run(args: argparse.Namespace) -> int:
    from lens_ebpf.k8s.client import NotConfigured, api_client
    from lens_ebpf.recorder import service
    from lens_ebpf.recorder.store.queries import QueryError
    from lens_ebpf.recorder.store.writer import DatabaseError

    cfg = config.load(args.config, overrides=overrides(args))
    logging.basicConfig(level=cfg.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    try:
        if args.command == "report":
            body = weekly_report(cfg, args)
            if args.output == "-":
                sys.stdout.buffer.write(body)
            else:
                with open(args.output, "wb") as out:
                    out.write(body)
            return 0
        if args.report:
            print(service.run_report(cfg, args.since, args.node, args.json, args.cluster))
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
    service.settle_heap()
    lost = app.leadership.lost if app.leadership is not None else threading.Event()
    while not stop.wait(1):  # set by SIGTERM or SIGINT
        if lost.is_set():  # as controller-runtime's managers do: a fresh start follows
            log.error("recorder: this replica stopped leading (the Lease could not be "
                      "renewed in time); exiting, to start afresh and campaign again")  # fmt: skip
            app.stop(flush_timeout=2)
            return 1
    app.stop()
    return 0


def main(argv: list[str] | None = None, prog: str = "lens-ebpf-recorder") -> int:
    args = build_parser(prog).parse_args(argv)
    return run_command(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
