"""Leadership among replicas: the current term of the Lease and every term's holder."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    String,
    Table,
)

from lens_ebpf.recorder.store.schema.meta import NAME, metadata

# leadership among replicas (recorder.leader_election): the current term of a Lease, the
# one row every leader write locks and checks (a write of an older term is refused), and
# every term's holder with when it began and when it wrote first and last
recorder_leader = Table(
    "recorder_leader",
    metadata,
    Column("name", String(NAME), primary_key=True),  # the Lease's name
    Column("term", BigInteger, nullable=False),
    Column("holder", String(NAME), nullable=False),
    Column("endpoint", String(NAME), nullable=False, default=""),  # its REST, host:port
    Column("since", DateTime(timezone=True), nullable=False),
)
leader_terms = Table(
    "leader_terms",
    metadata,
    Column("name", String(NAME), primary_key=True),
    Column("term", BigInteger, primary_key=True),
    Column("holder", String(NAME), nullable=False),
    Column("endpoint", String(NAME), nullable=False, default=""),
    Column("acquired_at", DateTime(timezone=True), nullable=False),
    Column("first_write_at", DateTime(timezone=True), nullable=True),
    Column("last_write_at", DateTime(timezone=True), nullable=True),
    Column("writes", BigInteger, nullable=False, default=0),  # transactions of the term
)
