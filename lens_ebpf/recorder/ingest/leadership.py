"""This replica among the others (recorder.leader_election): the Lease it campaigns for,
the database term it claims when it wins (store/leader.py: what fences every leader
write), what leading starts and losing ends, and the log lines the others hand it.

One replica leads: it alone runs the watches and their writes, the finalizers and every
periodic job. Every replica serves the API, the collector protocol and remote write from
the database. POST /logs is taken by any replica and handed to the leader, which alone
keeps training progress in memory (each workload's rolling median, the iterations seen
per rank, open slowdowns and stalls): a job's lines spread over replicas give the same
points, median and events as one replica would, and its answer waits for the points'
commit, so a sender retries what was not stored (docs/recorder/replicas.md).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from lens_ebpf.core.exposition import counter, gauge
from lens_ebpf.k8s.election import ElectionSettings, LeaderElector, LeaseApi
from lens_ebpf.recorder.config import LeaderElectionConfig
from lens_ebpf.recorder.ingest.admission import Outcome
from lens_ebpf.recorder.store.leader import LeaderFence

log = logging.getLogger(__name__)

FORWARDED = "x-lens-forwarded-by"  # a follower's hand-off: the leader must not pass it on
PASSED = ("content-type", "content-encoding", "authorization")


def identity_of(cfg: LeaderElectionConfig) -> str:
    return cfg.identity or os.environ.get("POD_NAME", "") or socket.gethostname()


def endpoint_of(cfg: LeaderElectionConfig, port: int) -> str:
    """host:port the other replicas reach this one's REST at."""
    if cfg.advertise:
        return cfg.advertise
    host = os.environ.get("POD_IP", "") or socket.gethostname()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Leadership(Collector):
    def __init__(
        self,
        cfg: LeaderElectionConfig,
        namespace: str,
        engine: Engine,
        api_client: Any,
        request_timeout: float,
        port: int,
        tls: tuple[str, str] | None,
        recover: Callable[[], None],
        lead: Callable[[], None],
        unlead: Callable[[], None],
    ) -> None:
        """Once this replica's term is claimed: recover() reads the leader's state back,
        then the leader-only jobs may run, and lead() starts the watches; unlead() ends
        them (the Lease lost or given up)."""
        self.cfg = cfg
        self.identity = identity_of(cfg)
        self.endpoint = endpoint_of(cfg, port)
        self.tls = tls  # (cert, key) of the service's HTTPS: how the leader is reached
        self._recover, self._lead, self._unlead = recover, lead, unlead
        self.fence = LeaderFence(
            engine, cfg.name, self.identity, self.endpoint, lambda: self.elector.is_leader()
        )
        self.elector = LeaderElector(
            ElectionSettings(
                namespace,
                cfg.name,
                self.identity,
                cfg.lease_duration_seconds,
                cfg.renew_deadline_seconds,
                cfg.retry_period_seconds,
                min(request_timeout, cfg.renew_deadline_seconds / 2),
            ),
            LeaseApi(api_client, request_timeout),
            self._started,
            self._stopped,
            once=True,
        )
        self.working = False  # the leader's parts run (its term claimed)
        self.lost = threading.Event()  # leading ended: a replica leads once (then restarts)
        self._stop = threading.Event()
        self.forwards: dict[str, int] = {"ok": 0, "refused": 0, "unavailable": 0}

    # -- the Lease and the term ----------------------------------------------------------
    def start(self) -> None:
        self.elector.start()

    def stop(self) -> None:
        """Stop campaigning; a leader gives the Lease up (after its parts stopped)."""
        self._stop.set()
        self.elector.stop(release=True)

    def leads(self) -> bool:
        """The leader's parts may act: the Lease is held and this replica's term claimed."""
        return self.working and self.elector.is_leader()

    def _started(self) -> None:
        while self.elector.is_leader() and not self._stop.is_set():
            try:
                self.fence.claim()
                break
            except SQLAlchemyError as exc:  # the database is down: no leader write before
                log.warning(
                    "recorder: leading, but the term cannot be claimed (%s); again " "in a second",
                    type(exc).__name__,
                )
                time.sleep(1)
        else:
            return
        self._recover()
        self.working = True  # the jobs' gate opens: their first runs come at once
        self._lead()

    def _stopped(self) -> None:
        self.working = False
        self.lost.set()
        self._unlead()

    def state(self) -> dict[str, Any]:
        holder, endpoint = self.leader()
        return {
            "identity": self.identity,
            "leading": self.leads(),
            "term": self.fence.term,
            "lease_holder": self.elector.holder,
            "leader": holder,
            "leader_endpoint": endpoint,
        }

    def leader(self) -> tuple[str, str]:
        """(identity, endpoint) of the current term's leader, as the database says."""
        try:
            return self.fence.leader()
        except SQLAlchemyError:
            return "", ""

    # -- POST /logs handed to the leader --------------------------------------------------
    def forward(
        self, route: str, body: bytes, headers: dict[str, str], query: dict[str, str]
    ) -> Outcome:
        """The request as the leader answers it; 503 (retry) while none can."""
        if headers.get(FORWARDED):
            self.forwards["refused"] += 1
            return Outcome(
                503,
                f"{route}: handed here by {headers[FORWARDED]}, but "
                f"{self.identity} does not lead now: retry",
                headers={"Retry-After": "1"},
            )
        holder, endpoint = self.leader()
        if not endpoint or holder == self.identity:
            self.forwards["unavailable"] += 1
            return Outcome(
                503,
                f"{route}: no replica leads now (an election is under way): " "retry",
                headers={"Retry-After": "2"},
            )
        scheme = "https" if self.tls else "http"
        url = f"{scheme}://{endpoint}/{route.lstrip('/')}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        sent = {k: v for k, v in headers.items() if k in PASSED}
        sent[FORWARDED] = self.identity
        req = urllib.request.Request(url, data=body, headers=sent, method="POST")
        try:
            with urllib.request.urlopen(
                req, timeout=self.cfg.forward_timeout_seconds, context=self._context()
            ) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        except (OSError, ValueError) as exc:
            self.forwards["unavailable"] += 1
            return Outcome(
                503,
                f"{route}: the leader {holder} ({endpoint}) did not answer "
                f"({type(exc).__name__}): retry",
                headers={"Retry-After": "2"},
            )
        self.forwards["ok"] += 1
        try:
            doc = json.loads(raw) if raw else {}
            meta = doc.get("meta") or {}
            return Outcome(status, str(meta.get("message", "")), doc.get("data"))
        except (ValueError, AttributeError):
            return Outcome(status, raw[:200].decode(errors="replace"))

    def _context(self) -> ssl.SSLContext | None:
        """The replicas share the service's certificate (one Secret): it is the trust
        anchor, and the client certificate where mutual TLS is on; addresses are pod IPs,
        so the host name is not checked."""
        if not self.tls:
            return None
        cert, key = self.tls
        ctx = ssl.create_default_context(cafile=cert)
        ctx.check_hostname = False
        ctx.load_cert_chain(cert, key)
        return ctx

    # -- metrics ---------------------------------------------------------------------------
    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        e = self.elector
        lead = gauge(
            "lens_recorder_leader",
            "1 while this replica leads (its Lease held and " "its term claimed)",
        )
        lead.add({"identity": self.identity}, 1.0 if self.leads() else 0.0)
        yield lead
        yield counter(
            "lens_recorder_leader_transitions",
            "This replica's leadership changes: "
            "acquired (it began to lead), lost (a renewal missed its deadline), "
            "released (it stopped and gave the Lease up)",
            e.events,
            "event",
        )
        yield counter(
            "lens_recorder_lease_errors",
            "Lease reads and writes that failed: "
            "conflict (another replica wrote first), failure (the API)",
            {"conflict": e.conflicts, "failure": e.failures},
            "reason",
        )
        yield counter(
            "lens_recorder_leader_writes_refused",
            "Leader transactions the term " "check refused (this replica no longer led)",
            {"": self.fence.refused},
        )
        yield counter(
            "lens_recorder_logs_forwarded",
            "POST /logs a follower handed to the "
            "leader, by result: ok (the leader answered), refused (handed here "
            "though this replica does not lead), unavailable (no leader answered)",
            self.forwards,
            "result",
        )
