"""The recorder's database: engine, migrations, and one writer thread.

Every write goes through a bounded queue to one writer thread, in order. While the
database is down the writer keeps the batch it holds and retries with backoff; the queue
absorbs what arrives meanwhile, up to queue_max, and counts what it had to drop. A write
the database refuses (a constraint, bad data) is retried alone, then dropped and counted,
so one bad row cannot stall the rest. After a write commits, its callback runs (the
finalizer of a deleted workload comes off only once its final state is stored).
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Table,
    Text,
    bindparam,
    cast,
    column,
    create_engine,
    event,
    func,
    select,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import JSON
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError

from lens_ebpf.core.backoff import Backoff
from lens_ebpf.core.exposition import Buckets

log = logging.getLogger(__name__)

BATCH = 200
# histogram buckets for one commit, seconds
WRITE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class DatabaseError(Exception):
    """The database URL or schema cannot be used (worded for one line)."""


def engine_for(url: str) -> Engine:
    """An engine for a SQLAlchemy URL: sqlite:///path or postgresql+psycopg://..."""
    try:
        if url.startswith("sqlite"):
            eng = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

            @event.listens_for(eng, "connect")
            def _pragmas(dbapi_conn: Any, _record: Any) -> None:
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")  # readers (REST) never block the writer
                cur.close()

            return eng
        return create_engine(url, pool_pre_ping=True, connect_args={"connect_timeout": 5})
    except (SQLAlchemyError, ImportError, ValueError) as exc:
        raise DatabaseError(f"database_url {redact(url)}: {exc}") from None


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    head, at, tail = url.rpartition("@")
    if not at:
        return url
    scheme, _, cred = head.partition("://")
    user = cred.split(":", 1)[0]
    return f"{scheme}://{user}:***@{tail}"


MIGRATION_LOCK = 0x6C656E73  # "lens": the advisory lock migrations take on PostgreSQL


def upgrade(engine: Engine, cluster: str = "local", target: str = "head") -> str:
    """Bring the schema to the newest migration (or target); returns its revision. Rows
    stored before the schema knew clusters belong to cluster (the home one)."""
    from alembic import command
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext

    cfg = Config()
    cfg.set_main_option(
        "script_location", str(resources.files("lens_ebpf.recorder.store") / "migrations")
    )
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # replicas start together: one migrates, the others wait and find it done
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        cfg.attributes["connection"] = conn
        cfg.attributes["cluster"] = cluster
        command.upgrade(cfg, target)
        return str(MigrationContext.configure(conn).get_current_revision())


def _json_value(v: Any) -> Any:
    if isinstance(v, datetime):
        return v.isoformat()
    raise TypeError(f"{type(v).__name__} is not a column value")


def insert_rows(
    conn: Connection,
    table: Table,
    rows: list[dict[str, Any]],
    keys: list[str] | None = None,
    update: bool = False,
    returning: tuple[str, ...] = (),
) -> list[Any]:
    """rows (all with the same columns) into table in one statement; with keys, a row whose
    keys exist is skipped (update=False) or has its other columns updated. Returns the
    `returning` columns of the rows written.

    On PostgreSQL the rows travel as one JSON parameter expanded by json_to_recordset: one
    cached statement with one bind, where a multi-row VALUES makes the driver parse and
    bind every value of every row (most of the ingest's time at 1,000 nodes). SQLite takes
    them as executemany."""
    if not rows:
        return []
    cols = tuple(rows[0])
    pg = conn.dialect.name == "postgresql"
    ins = _insert_statement(table, cols, tuple(keys or ()), update, returning, pg)
    params: Any = {"rows": json.dumps(rows, default=_json_value)} if pg else rows
    if returning:
        return list(conn.execute(ins, params))
    conn.execute(ins, params)
    return []


@functools.lru_cache(maxsize=256)
def _insert_statement(
    table: Table,
    cols: tuple[str, ...],
    keys: tuple[str, ...],
    update: bool,
    returning: tuple[str, ...],
    pg: bool,
) -> Any:
    """insert_rows's statement, built once per shape: building the construct (its derived
    table's columns above all) cost a tenth of the ingest's time at 1,000 nodes."""
    ins: Any = postgresql.insert(table) if pg else sqlite.insert(table)
    if pg:
        src = (
            func.json_to_recordset(cast(bindparam("rows", type_=Text), JSON))
            .table_valued(*(column(c, table.c[c].type) for c in cols))
            .render_derived(with_types=True)
        )
        ins = ins.from_select(list(cols), select(*(src.c[c] for c in cols)))
    if keys:
        ins = (
            ins.on_conflict_do_update(
                index_elements=list(keys), set_={c: ins.excluded[c] for c in cols if c not in keys}
            )
            if update
            else ins.on_conflict_do_nothing(index_elements=list(keys))
        )
    if returning:
        ins = ins.returning(*(table.c[c] for c in returning))
    return ins


def upsert(conn: Connection, table: Table, row: dict[str, Any], keys: list[str]) -> None:
    """Insert row, or update every other column of the row that has its keys."""
    insert_rows(conn, table, [row], keys=keys, update=True)


def insert_new(conn: Connection, table: Table, row: dict[str, Any], keys: list[str]) -> bool:
    """Insert row unless one with the same keys exists; True when it was inserted."""
    return bool(insert_rows(conn, table, [row], keys=keys, returning=(keys[0],)))


Write = Callable[[Connection], None]


@dataclass
class Op:
    what: str  # the table or action, for errors and logs
    write: Write
    done: Callable[[], None] | None = None  # runs after the commit
    # consecutive ops with the same bulk writer are written by one call of it with their
    # items (multi-row statements); write() alone does the same for this op's item
    bulk: Callable[[Connection, list[Any]], None] | None = None
    item: Any = None
    fenced: bool = False  # a leader's write: only while the writer's fence lets it (LeaderWriter)


class Writer:
    """One thread applying queued writes in order, surviving database outages."""

    def __init__(
        self,
        engine: Engine,
        queue_max: int,
        retry_max: float = 10.0,
        fence: Callable[[Connection], bool] | None = None,
    ) -> None:
        self.engine = engine
        # with replicas: asked first in each transaction holding a leader's write; False
        # drops those writes (another replica leads now), counted in fenced
        self.fence = fence
        self.fenced = 0
        self.queue_max = queue_max
        self.retry_max = retry_max
        self._queue: deque[Op] = deque()
        self._cond = threading.Condition()
        self._busy = False
        self.up = True
        self.committed = 0  # writes committed
        self.dropped = 0  # refused by a full queue
        self.errors: dict[str, int] = {"unavailable": 0, "rejected": 0}
        self.last_error = ""
        self.writes = Buckets(WRITE_BUCKETS)  # commit durations (this thread observes)
        self._thread: threading.Thread | None = None
        self._submitted = threading.local()  # writes queued by each thread (a job's run)

    def submit(self, op: Op) -> bool:
        with self._cond:
            if len(self._queue) >= self.queue_max:
                self.dropped += 1
                log.warning(
                    "recorder: write queue full (%d); dropped a %s write", self.queue_max, op.what
                )
                return False
            self._queue.append(op)
            self._cond.notify_all()
        self._submitted.n = self.submitted_here() + 1
        return True

    def submitted_here(self) -> int:
        """Writes the calling thread has queued so far (a job's run: the difference)."""
        return int(getattr(self._submitted, "n", 0))

    def depth(self) -> int:
        with self._cond:
            return len(self._queue)

    def flush(self, timeout: float) -> bool:
        """Wait until every queued write is committed (or dropped as rejected)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
        return True

    def start(self, stop: threading.Event) -> None:
        self._thread = threading.Thread(
            target=self.run, args=(stop,), name="recorder-db", daemon=True
        )
        self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            with self._cond:
                self._cond.notify_all()
            self._thread.join(timeout)

    def run(self, stop: threading.Event) -> None:
        backoff = Backoff(self.retry_max)
        while True:
            with self._cond:
                while not self._queue and not stop.is_set():
                    self._cond.wait(0.5)
                if not self._queue:
                    return  # stopped with nothing left
                batch = [self._queue[i] for i in range(min(BATCH, len(self._queue)))]
                self._busy = True
            try:
                self._commit(batch)
                backoff.reset()
            except SQLAlchemyError as exc:
                if not _unavailable(exc):
                    self._one_by_one(batch)
                    continue
                self._down(exc)
                if stop.wait(backoff.next()):
                    return  # stopped while the database is down: RecorderApp.stop logs the rest
            except Exception:  # a write function's own failure: that write goes, not the writer
                self._one_by_one(batch)
            finally:
                self._idle()

    def _idle(self) -> None:
        with self._cond:
            self._busy = False
            self._cond.notify_all()

    def _commit(self, batch: list[Op]) -> None:
        start = time.monotonic()
        with self.engine.begin() as conn:
            todo = batch
            if self.fence is not None and any(op.fenced for op in batch) and not self.fence(conn):
                todo = [op for op in batch if not op.fenced]
            i = 0
            while i < len(todo):
                op, j = todo[i], i + 1
                if op.bulk is None:
                    op.write(conn)
                else:
                    while j < len(todo) and todo[j].bulk == op.bulk:
                        j += 1
                    op.bulk(conn, [o.item for o in todo[i:j]])
                i = j
        self.writes.observe(time.monotonic() - start)
        if not self.up:
            log.info("recorder: database is back; writing %d queued writes", self.depth())
        self.up = True
        self._done(batch, todo)

    def _done(self, batch: list[Op], written: list[Op] | None = None) -> None:
        written = batch if written is None else written
        dropped = len(batch) - len(written)
        with self._cond:
            for _ in batch:
                self._queue.popleft()
            self.committed += len(written)
            self.fenced += dropped
        if dropped:
            log.warning(
                "recorder: %d leader writes dropped: this replica does not lead now", dropped
            )
        for op in written:
            if op.done is not None:
                try:
                    op.done()
                except Exception:  # a callback's failure is its own; the rows are stored
                    log.exception("recorder: after writing %s", op.what)

    def _one_by_one(self, batch: list[Op]) -> None:
        """A batch the database refused: each write alone; the ones it refuses are dropped."""
        for op in batch:
            try:
                self._commit([op])
            except SQLAlchemyError as exc:
                if _unavailable(exc):
                    self._down(exc)
                    return  # the rest stay queued
                self._reject(op, exc)
            except Exception as exc:  # the write's own code failed (a value it cannot store)
                log.exception("recorder: a %s write failed", op.what)
                self._reject(op, exc)

    def _reject(self, op: Op, exc: Exception) -> None:
        self.errors["rejected"] += 1
        self.last_error = f"{op.what}: {type(exc).__name__}: {exc}"[:300]
        log.error("recorder: the database refused a %s write: %s", op.what, self.last_error)
        with self._cond:
            if self._queue and self._queue[0] is op:
                self._queue.popleft()

    def _down(self, exc: Exception) -> None:
        self.errors["unavailable"] += 1
        if self.up:
            log.warning(
                "recorder: database unavailable (%s); %d writes queued",
                (str(exc).splitlines() or [""])[0][:200],
                self.depth(),
            )
        self.up = False
        self.last_error = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"[:300]


class LeaderWriter(Writer):
    """The writer (its queue, thread and counters: the same object's state) as the parts
    that work only on the leader see it: each write they submit is fenced."""

    def __init__(self, writer: Writer) -> None:  # noqa: not Writer.__init__: it is that writer
        self.__dict__ = writer.__dict__

    def submit(self, op: Op) -> bool:
        op.fenced = True
        return super().submit(op)


def _unavailable(exc: SQLAlchemyError) -> bool:
    """The database cannot be reached (as opposed to refusing this write)."""
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)
