"""The recorder against the API stand-in and a real database (SQLite, and PostgreSQL from
Debian's package, started here)."""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select

from lens_ebpf.recorder import config
from tests import pglab
from tests.k8slab import FakeApiServer, eventually

_names = itertools.count()
# API_EXAMPLES_OUT=FILE: the fullest 2000 answer of each cluster API route the tests get
# is kept there (scripts/api_examples.py writes them into docs/recorder/api-examples.md)
EXAMPLES = os.environ.get("API_EXAMPLES_OUT", "")


def example(path: str, body: Any) -> None:
    """Keep body as the example answer of path's route, if its fullest yet."""
    if not EXAMPLES or not isinstance(body, dict) or body.get("meta", {}).get("code") != 2000:
        return
    route = "/v1/" + re.sub(r"^/?(v1|api|lens/v1)/", "", path.split("?")[0]).lstrip("/")
    file = Path(EXAMPLES)
    got = json.loads(file.read_text()) if file.exists() else {}
    if len(json.dumps(body)) > len(json.dumps(got.get(route, {}).get("body", {}))):
        got[route] = {"request": "/v1/" + re.sub(r"^/?(v1|api|lens/v1)/", "", path), "body": body}
        file.write_text(json.dumps(got, indent=1))


@pytest.fixture(scope="session")
def postgres() -> Iterator[pglab.Postgres]:
    why = pglab.unavailable()
    if why:
        pytest.skip(why)
    pg = pglab.Postgres().init()
    yield pg
    pg.destroy()


PG_TIMEZONE = "Asia/Kolkata"  # UTC+05:30


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'recorder.db'}"
    pg = request.getfixturevalue("postgres")
    # its sessions half an hour off UTC, as a server set up in a local zone hands times
    # back: every stored time must read the same as on SQLite
    return str(pg.create_database(f"lens_{next(_names)}", timezone=PG_TIMEZONE))


@pytest.fixture()
def api() -> Iterator[FakeApiServer]:
    srv = FakeApiServer().start()
    yield srv
    srv.kill()


Factory = Callable[..., Any]


@pytest.fixture()
def recorder_app(api: FakeApiServer, tmp_path: Path) -> Iterator[Factory]:
    """make(db_url, **recorder settings) -> a started RecorderApp whose pod watch has
    listed (what a test changes next reaches it as watch events, one by one, however
    slow the machine); all stopped at the end."""
    from lens_ebpf.k8s.client import api_client
    from lens_ebpf.recorder.service import RecorderApp

    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
    apps: list[Any] = []

    def make(
        url: str, clock: Any = None, top: dict[tuple[str, ...], Any] | None = None, **settings: Any
    ) -> Any:
        """settings: recorder.* keys (a__b for a.b); top: other keys, by their path."""
        over: dict[tuple[str, ...], Any] = {
            ("recorder", "database_url"): url,
            ("recorder", "listen"): "127.0.0.1:0",
            ("recorder", "collect_listen"): "127.0.0.1:0",
            ("recorder", "db_retry_max_seconds"): 0.5,
            ("kubernetes", "backoff_max_seconds"): 0.5,
            # the periodic jobs run once at start (a test calls them for their times);
            # a snapshot every 30 s would add writes to the ones a test counts
            ("recorder", "jobs", "allocation_seconds"): 3600,
        }
        for key, value in settings.items():
            over[("recorder", *key.split("__"))] = value
        over.update(top or {})
        cfg = config.load(env={}, overrides=over)
        client = api_client("kubeconfig", str(kubeconfig))
        app = RecorderApp(cfg, client, clock) if clock else RecorderApp(cfg, client)
        app.start()
        apps.append(app)
        eventually(app.tracker.pod_reflector.synced.is_set, timeout=10)
        # the node watch's first list and the jobs' first run write too: done before a
        # test stops the database or counts the queue
        eventually(app.nodes.reflector.synced.is_set, timeout=10)
        eventually(lambda: app.jobs.runs["prune"] >= 1, timeout=10)
        return app

    yield make
    for app in apps:
        if not app._stop.is_set():
            app.stop(flush_timeout=2)


def _utc(value: Any) -> Any:
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC)
    return value


def rows(url: str, table: str) -> list[dict[str, Any]]:
    """Every row of a table, as dicts, in insertion order where the table has one; times
    as the database hands them back, but in UTC (PostgreSQL's come in its session's
    zone, SQLite's without one)."""
    from lens_ebpf.recorder.store import schema

    tab = schema.metadata.tables[table]
    eng = create_engine(url)
    try:
        with eng.connect() as conn:
            order = [tab.c.id] if "id" in tab.c else list(tab.primary_key.columns)
            return [
                {k: _utc(v) for k, v in r.items()}
                for r in conn.execute(select(tab).order_by(*order)).mappings()
            ]
    finally:
        eng.dispose()


def recorded(url: str, pods: int, nodes: int) -> bool:
    """The service has stored this many running GPU pods and nodes: a snapshot taken
    before the nodes are in counts no capacity, so no cluster allocation (the pods' and the
    nodes' watches store independently)."""
    running = sum(r["running"] for r in rows(url, "gpu_pods"))
    return running == pods and len(rows(url, "nodes")) == nodes
