"""Alerts stored before what they concern was known (one that came in the second after
its pod first appeared: before the tracker wrote the pod, or before the remote-write
maps read it), enriched once it is. The leader looks at the alerts of the last WINDOW
still without their workload every SECONDS, each with retries of its own (TRIES, each
wait twice the last), and stores what their labels name by then: workload, pod, node
and enriched_data, and the silence that holds them now, as ingest.store() would have;
the workload's timeline lists them from then on."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, select, update

from lens_ebpf.recorder.alerts.enrich import Concern
from lens_ebpf.recorder.alerts.silences import matches
from lens_ebpf.recorder.store import schema as t
from lens_ebpf.recorder.store.writer import insert_new

SECONDS = 5.0  # how often the leader looks (its job's interval)
WINDOW = timedelta(hours=1)  # alerts stored this recently are looked at
TRIES = 8  # looks per alert at most: after 5, 10, 20, ... 640 s (21 minutes in all)
OPEN = ("firing", "silenced")


def pending(conn: Connection, since: datetime) -> list[Any]:
    """The open alerts stored since then without their workload (id, labels, starts_at,
    pod_id)."""
    ae = t.alert_events
    return list(
        conn.execute(
            select(ae.c.id, ae.c.labels, ae.c.starts_at, ae.c.pod_id)
            .where(ae.c.workload_id == "", ae.c.status.in_(OPEN), ae.c.created_at >= since)
            .order_by(ae.c.created_at, ae.c.id)
        )
    )


def enrich(
    conn: Connection, found: dict[str, Concern], now: datetime, silences: list[dict[str, Any]]
) -> int:
    """The alerts of found (by id) that are still open and without their workload,
    enriched with their Concern and silenced where a silence holds them now, in conn's
    transaction: how many."""
    ae = t.alert_events
    done = 0
    for r in conn.execute(
        select(ae).where(ae.c.id.in_(sorted(found)), ae.c.workload_id == "", ae.c.status.in_(OPEN))
    ).all():
        c = found[r.id]
        fields: dict[str, Any] = {
            "workload_id": c.workload_uid,
            "workload_name": c.workload_name,
            "pod_name": c.pod or r.pod_name,
            "pod_id": c.pod_uid or r.pod_id,
            "node_name": c.node or r.node_name,
            "enriched_data": {**(r.enriched_data or {}), **c.enriched(conn, r.cluster_name)},
            "updated_at": now,
        }
        if r.status == "firing":
            view = {**dict(r._mapping), **fields}
            hit = next((s for s in silences if matches(s, view, now)), None)
            if hit is not None:
                fields["status"] = "silenced"
                insert_new(
                    conn,
                    t.silenced_alerts,
                    {
                        "silence_id": hit["id"],
                        "alert_id": r.id,
                        "alert_name": r.alert_name,
                        "cluster_name": r.cluster_name,
                        "silenced_at": now,
                    },
                    ["silence_id", "alert_id"],
                )
        conn.execute(update(ae).where(ae.c.id == r.id).values(**fields))
        done += 1
    return done


@dataclass
class Retries:
    """Each pending alert's looks so far and when the next is due (the leader's, in
    memory: a new leader starts them again, within WINDOW)."""

    tries: dict[str, tuple[int, datetime]] = field(default_factory=dict)
    given_up: int = 0  # alerts looked at TRIES times without their workload found

    def due(self, rows: list[Any], now: datetime) -> list[Any]:
        """The rows whose next look is now (the others' entries kept, gone ones dropped)."""
        self.tries = {r.id: self.tries[r.id] for r in rows if r.id in self.tries}
        return [
            r
            for r in rows
            if self.tries.get(r.id, (0, now))[0] < TRIES
            and self.tries.get(r.id, (0, now))[1] <= now
        ]

    def missed(self, alert_id: str, now: datetime) -> None:
        """A look that did not find its workload: the next one after twice the wait."""
        n = self.tries.get(alert_id, (0, now))[0] + 1
        self.tries[alert_id] = (n, now + timedelta(seconds=SECONDS * 2 ** (n - 1)))
        if n == TRIES:
            self.given_up += 1
