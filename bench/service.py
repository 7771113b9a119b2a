"""The recorder as the cluster benches start it: file limits for a thousand
streams, a database (PostgreSQL from tests/pglab.py, or a SQLite file), the API stand-in,
and a started RecorderApp."""

from __future__ import annotations

import resource
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from lens_ebpf.k8s.client import api_client
from lens_ebpf.recorder import config, service
from tests import pglab
from tests.k8slab import FakeApiServer


def allow_streams(nodes: int) -> None:
    """Open files for a stream and connection per node, both ends in this process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * nodes + 1024)), hard))


def database(postgres: bool, tmp: Path, name: str) -> tuple[str, pglab.Postgres | None]:
    pg = pglab.Postgres().init() if postgres else None
    return (pg.create_database(name) if pg else f"sqlite:///{tmp / 'recorder.db'}"), pg


def start(
    url: str,
    tmp: Path,
    api: FakeApiServer,
    overrides: dict[tuple[str, ...], Any] | None = None,
    clock: Callable[[], datetime] | None = None,
) -> service.RecorderApp:
    over = {
        ("recorder", "database_url"): url,
        ("recorder", "listen"): "127.0.0.1:0",
        ("recorder", "collect_listen"): "127.0.0.1:0",
        **(overrides or {}),
    }
    client = api_client("kubeconfig", str(api.kubeconfig(tmp / "kc")))
    cfg = config.load(env={}, overrides=over)
    app = service.RecorderApp(cfg, client, clock) if clock else service.RecorderApp(cfg, client)
    app.start()
    service.settle_heap()  # as the service's process does (recorder/cli.py)
    return app
