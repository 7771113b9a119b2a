"""Leadership as the database sees it: each replica that comes to lead claims a new term
(recorder_leader's row for the Lease: term + 1, its identity and endpoint; a row of
leader_terms), and every leader write checks, in its own transaction, that its term is
still the current one and that this replica still leads by the Lease.

The check updates the one row the claim updates, so the two serialize: a claim waits for
the old leader's open write, and a write after the claim finds another holder and is
refused (the writer drops it, counted). However long an old leader was paused or cut off,
no write of its term lands after the next term began: the "writes never overlap" of
replicas rests on this, not on clocks. PostgreSQL only (replicas need a shared database).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy import Connection, Engine, func, select, update
from sqlalchemy.dialects import postgresql

from lens_ebpf.recorder.store import schema as t

log = logging.getLogger(__name__)


class LeaderFence:
    def __init__(
        self, engine: Engine, name: str, identity: str, endpoint: str, leading: Callable[[], bool]
    ) -> None:
        self.engine, self.name, self.identity, self.endpoint = engine, name, identity, endpoint
        self.leading = leading  # the Lease's word: this replica leads now
        self.term = 0  # the term this replica claimed (0: none)
        self.refused = 0  # leader transactions refused: not this replica's term, or not leading
        self._seen: tuple[float, str, str] = (0.0, "", "")  # when read, holder, endpoint
        self._lock = threading.Lock()

    def claim(self) -> int:
        """A new term for this replica (after the Lease is won); its number."""
        lead, terms = t.recorder_leader, t.leader_terms
        now = func.clock_timestamp()
        with self.engine.begin() as conn:
            conn.execute(
                postgresql.insert(lead)
                .values(
                    name=self.name,
                    term=0,
                    holder="",
                    endpoint="",
                    since=now,
                )
                .on_conflict_do_nothing(index_elements=["name"])
            )
            term = (
                int(
                    conn.execute(
                        select(lead.c.term).where(lead.c.name == self.name).with_for_update()
                    ).scalar_one()
                )
                + 1
            )
            conn.execute(
                update(lead)
                .where(lead.c.name == self.name)
                .values(term=term, holder=self.identity, endpoint=self.endpoint, since=now)
            )
            conn.execute(
                terms.insert().values(
                    name=self.name,
                    term=term,
                    holder=self.identity,
                    endpoint=self.endpoint,
                    acquired_at=now,
                    writes=0,
                )
            )
        self.term = term
        log.info("recorder: %s leads, term %d", self.identity, term)
        return term

    def check(self, conn: Connection) -> bool:
        """In a leader write's transaction, first: whether it may go on (this replica
        leads by the Lease, and its term is the current one); counted in the term's row."""
        if not self.term or not self.leading():
            self.refused += 1
            return False
        lead, terms = t.recorder_leader, t.leader_terms
        now = func.clock_timestamp()
        mine = conn.execute(
            update(lead)
            .where(
                lead.c.name == self.name, lead.c.term == self.term, lead.c.holder == self.identity
            )
            .values(holder=self.identity)
        ).rowcount
        if mine != 1:
            self.refused += 1
            return False
        first = func.coalesce(terms.c.first_write_at, now)
        conn.execute(
            update(terms)
            .where(terms.c.name == self.name, terms.c.term == self.term)
            .values(writes=terms.c.writes + 1, last_write_at=now, first_write_at=first)
        )
        return True

    def leader(self, max_age: float = 1.0) -> tuple[str, str]:
        """(holder, endpoint) of the current term, read at most every max_age seconds."""
        with self._lock:
            at, holder, endpoint = self._seen
            if time.monotonic() - at < max_age:
                return holder, endpoint
        lead = t.recorder_leader
        with self.engine.connect() as conn:
            row = conn.execute(
                select(lead.c.holder, lead.c.endpoint).where(lead.c.name == self.name)
            ).first()
        holder, endpoint = (str(row.holder), str(row.endpoint)) if row else ("", "")
        with self._lock:
            self._seen = (time.monotonic(), holder, endpoint)
        return holder, endpoint
