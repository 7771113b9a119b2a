"""Alembic's environment for the recorder: the caller hands over a connection
(db.upgrade), so there is no alembic.ini and no URL here."""

from __future__ import annotations

from alembic import context

from lens_ebpf.recorder.store.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
