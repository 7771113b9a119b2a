"""The recorder's command line: `lens-ebpf recorder` (and `lens-ebpf-recorder`; `lens-ebpf-cluster`
is its old name, kept)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from lens_ebpf.core.commandline import CliError, parse_listen, run_command
from lens_ebpf.recorder import config

if TYPE_CHECKING:
    from lens_ebpf.k8s.dynamic import DynamicApi, Kind

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
    rec.add_argument(
        "--report",
        action="store_true",
        help="print the workloads that used GPUs since --since and exit",
    )
    rec.add_argument("--since", default="7d", help="with --report: RFC 3339, or an age (12h, 7d)")
    rec.add_argument("--node", default="", help="with --report: only GPU pods on this node")
    rec.add_argument("--cluster", default="", help="with --report: this cluster (not the home one)")
    rec.add_argument("--json", action="store_true", help="with --report: one object per line")
    rec.add_argument(
        "--remove-finalizers",
        action="store_true",
        help="take the recorder's finalizer off every object and exit " "(run before uninstalling)",
    )
    sub = rec.add_subparsers(
        dest="command",
        metavar="{report}",
        help="report: the weekly GPU utilization report of a week; " "none: run the service",
    )
    rep = sub.add_parser(
        "report",
        help="the weekly GPU utilization report of a week",
        epilog=REPORT_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rep.add_argument(
        "--week",
        default="",
        help="an ISO week, 2026-W47 (default: the last completed one; the "
        "current one: up to now)",
    )
    rep.add_argument("--format", choices=("html", "pdf", "json"), default="html")
    rep.add_argument("-o", "--output", default="-", help="the file to write (default stdout)")
    rep.add_argument(
        "--cluster",
        dest="report_cluster",
        default="",
        help="this cluster (default recorder.cluster_name)",
    )
    # also after the subcommand; absent there, the recorder's own flags stand
    for flag, text in (
        ("--config", "YAML config file (also LENS_CONFIG)"),
        ("--database", "SQLAlchemy URL (recorder.database_url)"),
    ):
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
        wk = (
            week.parse(args.week, r.reports.timezone)
            if args.week
            else week.containing(now, r.reports.timezone).before()
        )
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


# -- one-shot commands ---------------------------------------------------------------
# kinds whose finalizers --remove-finalizers clears even when the database never saw them
BUILTIN_KINDS = (
    ("apps/v1", "ReplicaSet"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "StatefulSet"),
    ("apps/v1", "DaemonSet"),
    ("batch/v1", "Job"),
    ("batch/v1", "CronJob"),
)


def run_report(cfg: config.Config, since: str, node: str, as_json: bool, cluster: str = "") -> str:
    """`recorder --report`: the GPU pods of a span, from the database."""
    import json
    from datetime import UTC, datetime
    from pathlib import Path

    from sqlalchemy.exc import SQLAlchemyError

    from lens_ebpf.recorder.store import queries
    from lens_ebpf.recorder.store.writer import DatabaseError, engine_for, redact

    now = datetime.now(UTC)
    start = queries.parse_since(since, now)
    url = cfg.recorder.database_url
    path = url.removeprefix("sqlite:///")
    if url.startswith("sqlite:///") and path != ":memory:" and not Path(path).exists():
        raise DatabaseError(f"no recorder database at {path}")
    engine = engine_for(url)
    try:
        with engine.connect() as conn:
            lines = queries.report(conn, start, now, node, cluster or cfg.recorder.cluster_name)
    except SQLAlchemyError as exc:
        msg = str(exc).splitlines()[0][:200]
        raise DatabaseError(f"database {redact(url)}: {type(exc).__name__}: {msg}") from None
    finally:
        engine.dispose()
    if as_json:
        return "\n".join(
            json.dumps({k: queries.json_value(v) for k, v in vars(x).items()}, sort_keys=True)
            for x in lines
        )
    return queries.format_report(lines)


def remove_finalizers(cfg: config.Config, api_client: Any) -> dict[str, int]:
    """Take the recorder's finalizer off every object that holds it (uninstall), in every
    cluster it follows (the home one, clusters:, the multi-k8s-config Secret's): the kinds
    the database knows and the built-in workload kinds. Returns removals per kind ("Kind"
    in the home cluster, "cluster: Kind" in the others); a cluster it cannot reach is
    said in the log and left."""
    from sqlalchemy import select
    from sqlalchemy.exc import SQLAlchemyError

    from lens_ebpf.k8s.dynamic import DynamicApi
    from lens_ebpf.recorder.store import schema
    from lens_ebpf.recorder.store.writer import engine_for

    kinds: set[tuple[str, str]] = set(BUILTIN_KINDS)
    try:
        engine = engine_for(cfg.recorder.database_url)
        with engine.connect() as conn:
            wl = schema.gpu_workloads
            q = select(wl.c.api_version, wl.c.kind).distinct()
            kinds |= {(str(a), str(k)) for a, k in conn.execute(q)}
        engine.dispose()
    except SQLAlchemyError as exc:
        log.warning(
            "recorder: database unreadable (%s); clearing the built-in kinds only",
            type(exc).__name__,
        )
    out: dict[str, int] = {}
    for cluster, client in _clients(cfg, api_client).items():
        api = DynamicApi(client, cfg.kubernetes.request_timeout_seconds)
        prefix = "" if cluster == cfg.recorder.cluster_name else f"{cluster}: "
        try:
            for api_version, kind_name in sorted(kinds):
                kind = api.kind(api_version, kind_name)
                if kind is not None:
                    out[prefix + kind_name] = _strip_kind(api, kind)
        except Exception as exc:  # that cluster's API is down: the others still
            if not prefix:
                raise
            log.warning("recorder: cluster %s: %s", cluster, f"{type(exc).__name__}: {exc}"[:300])
    return out


def _clients(cfg: config.Config, home: Any) -> dict[str, Any]:
    """Every cluster's API client: the home one first, then those a client can be made for."""
    from lens_ebpf.k8s.dynamic import DynamicApi
    from lens_ebpf.recorder.tracker.clusters import Source, read_clusters_secret

    sources = {name: Source("config", e.kubeconfig) for name, e in sorted(cfg.clusters.items())}
    if cfg.multicluster.secret:
        try:
            home_api = DynamicApi(home, cfg.kubernetes.request_timeout_seconds)
            for name, text in read_clusters_secret(home_api, cfg).items():
                sources.setdefault(name, Source("secret", text=text))
        except Exception as exc:
            log.warning("recorder: multi-cluster secret: %s", f"{type(exc).__name__}: {exc}"[:300])
    out = {cfg.recorder.cluster_name: home}
    for name, src in sources.items():
        try:
            out.setdefault(name, src.client())
        except Exception as exc:
            log.warning("recorder: cluster %s: %s", name, f"{type(exc).__name__}: {exc}"[:300])
    return out


def _strip_kind(api: DynamicApi, kind: Kind) -> int:
    from lens_ebpf.k8s.reflector import call_raw
    from lens_ebpf.recorder import lifecycle as lc
    from lens_ebpf.recorder.tracker import change_finalizer

    removed = 0
    doc = call_raw(api.lister(kind), timeout=api.timeout)
    for obj in doc.get("items") or ():
        m = obj.get("metadata") or {}
        if lc.FINALIZER in (m.get("finalizers") or ()):
            result = change_finalizer(
                api, kind, m.get("namespace", ""), m["name"], str(m.get("uid", "")), add=False
            )
            removed += result == "ok"
    return removed


def run(args: argparse.Namespace) -> int:
    from lens_ebpf.k8s.client import NotConfiguredError, api_client
    from lens_ebpf.recorder import service
    from lens_ebpf.recorder.store.queries import QueryError
    from lens_ebpf.recorder.store.writer import DatabaseError

    cfg = config.load(args.config, overrides=overrides(args))
    logging.basicConfig(
        level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
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
            print(run_report(cfg, args.since, args.node, args.json, args.cluster))
            return 0
        try:
            client = api_client(cfg.kubernetes.mode, cfg.kubernetes.kubeconfig)
        except NotConfiguredError as exc:
            raise CliError(f"recorder: needs the Kubernetes API ({exc})") from None
        except ValueError as exc:
            raise CliError(f"recorder: {exc}") from None
        if args.remove_finalizers:
            for kind, n in sorted(remove_finalizers(cfg, client).items()):
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
    log.info(
        "recorder: schema %s, REST on %s, collector on %s",
        app.revision,
        cfg.recorder.listen,
        cfg.recorder.collect_listen or "off",
    )
    service.settle_heap()
    lost = app.leadership.lost if app.leadership is not None else threading.Event()
    while not stop.wait(1):  # set by SIGTERM or SIGINT
        if lost.is_set():  # as controller-runtime's managers do: a fresh start follows
            log.error(
                "recorder: this replica stopped leading (the Lease could not be "
                "renewed in time); exiting, to start afresh and campaign again"
            )
            app.stop(flush_timeout=2)
            return 1
    app.stop()
    return 0


def main(argv: list[str] | None = None, prog: str = "lens-ebpf-recorder") -> int:
    args = build_parser(prog).parse_args(argv)
    return run_command(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
