"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's semantics
(k8s.io/client-go/tools/leaderelection):

- A candidate tries to acquire the Lease every retry period: it creates it when there is
  none, takes it when it is free (no holder) or when its record has not changed for
  lease duration as this candidate observed it (its own clock from the moment it saw that
  record: the holder's clock and the API server's do not matter), and otherwise waits.
  Every write carries the resourceVersion read, so of two candidates one wins (409 for
  the other).
- The leader renews every retry period; when no renewal has succeeded for renew deadline,
  it stops leading (on_stopped_leading) before another candidate can see the Lease as
  expired (renew deadline < lease duration). is_leader() says no as soon as the renew
  deadline has passed, whatever the renewing thread is doing.
- Stopped cleanly, the leader releases the Lease (holder emptied) so another candidate
  takes it at once rather than after lease duration.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger(__name__)

MICROTIME = "%Y-%m-%dT%H:%M:%S.%fZ"  # metav1.MicroTime as the API writes it


@dataclass(frozen=True)
class ElectionSettings:
    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    request_timeout: float = 5.0

    def __post_init__(self) -> None:
        if not self.identity:
            raise ValueError("leader election needs an identity (the pod's name)")
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                f"leader election: retry period ({self.retry_period} s) < renew deadline "
                f"({self.renew_deadline} s) < lease duration ({self.lease_duration} s) is "
                "required (a leader must give up before another can take over)"
            )


class LeaseApi:
    """The Lease calls, as raw JSON both ways: get (None when there is none), create,
    replace (the resourceVersion in the body guards it); an ApiException carries the
    status. Not through the client's models: V1Lease writes a time whose microseconds are
    0 without them, which the API refuses (400: it wants MicroTime's six digits)."""

    def __init__(self, api_client: Any, timeout: float) -> None:
        self.client = api_client
        self.timeout = timeout

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        c = self.client
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        if hasattr(c, "param_serialize"):  # kubernetes >= 31 (its generated calls validate)
            m, url, hdrs, sent, post = c.param_serialize(
                method=method,
                resource_path=path,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            resp = c.call_api(
                m,
                url,
                header_params=hdrs,
                body=sent,
                post_params=post,
                _request_timeout=self.timeout,
            )
            resp.read()
        else:  # older clients send the dict as given
            resp = c.call_api(
                path,
                method,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=self.timeout,
                _return_http_data_only=True,
            )
        if not 200 <= resp.status < 300:
            raise ApiException(http_resp=resp)
        doc = json.loads(resp.data)
        if not isinstance(doc, dict):
            raise ValueError(f"{method} {path}: answer is not a JSON object")
        return doc

    @staticmethod
    def _path(namespace: str, name: str = "") -> str:
        base = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        return f"{base}/{name}" if name else base

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", self._path(namespace, name))
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise

    def create(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", self._path(namespace), body)

    def replace(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("PUT", self._path(namespace, name), body)


def _now_text() -> str:
    return datetime.now(UTC).strftime(MICROTIME)


class LeaderElector:
    """Campaigns for the Lease in a thread of its own until stop(); calls
    on_started_leading() when it leads (in a new thread: the renewals go on meanwhile) and
    on_stopped_leading() when it stops (a renewal missed its deadline, or stop())."""

    def __init__(
        self,
        settings: ElectionSettings,
        api: Any,
        on_started_leading: Callable[[], None] = lambda: None,
        on_stopped_leading: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        once: bool = False,
    ) -> None:
        """once: after leading ends, campaign no more (what leading started is not made to
        start twice: the service's process ends and starts afresh)."""
        self.s, self.api, self.clock, self.once = settings, api, clock, once
        self.on_started_leading, self.on_stopped_leading = on_started_leading, on_stopped_leading
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._leading = False
        self._renewed = 0.0  # clock() of the last successful acquire or renewal
        self._observed: tuple[str, str, int, str] | None = None  # the record last seen
        self._observed_at = 0.0  # clock() when it was first seen so
        self.holder = ""  # who holds the Lease, as last read ("" none)
        # counted: acquired (this replica began to lead), lost (a renewal missed its
        # deadline), released (stop() gave it up); failures: reads or writes that failed
        self.events: dict[str, int] = {"acquired": 0, "lost": 0, "released": 0}
        self.failures = 0
        self.conflicts = 0
        self.last_error = ""

    # -- what the service asks ---------------------------------------------------------
    def is_leader(self) -> bool:
        """Whether this replica leads now: it holds the Lease and renewed it within the renew
        deadline (asked by the leader-only jobs and every leader write)."""
        with self._lock:
            return self._leading and self.clock() - self._renewed < self.s.renew_deadline

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self, release: bool = True, timeout: float = 5.0) -> None:
        """Stop campaigning; a leader stops leading and (release) gives the Lease up."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        was = self._set_leading(False)
        if was:
            if release:
                self._release()
            self.on_stopped_leading()

    # -- the loop ----------------------------------------------------------------------
    def run(self) -> None:
        while not self._stop.is_set():
            if self._acquire_or_renew():
                if not self._leading:
                    self._set_leading(True)
                    self.events["acquired"] += 1
                    log.info(
                        "leader election: %s leads (Lease %s/%s)",
                        self.s.identity,
                        self.s.namespace,
                        self.s.name,
                    )
                    # in a thread of its own, as client-go runs it: the renewals go on
                    threading.Thread(
                        target=self.on_started_leading, name="leader-start", daemon=True
                    ).start()
            elif self._leading and self.clock() - self._renewed >= self.s.renew_deadline:
                self._set_leading(False)
                self.events["lost"] += 1
                log.error(
                    "leader election: %s could not renew the Lease within %.0f s; "
                    "stopped leading",
                    self.s.identity,
                    self.s.renew_deadline,
                )
                self.on_stopped_leading()
                if self.once:
                    return
            self._stop.wait(self.s.retry_period)

    def _set_leading(self, leading: bool) -> bool:
        with self._lock:
            was, self._leading = self._leading, leading
            return was

    def _record(self, lease: dict[str, Any]) -> tuple[str, str, int, str]:
        spec = lease.get("spec") or {}
        return (
            str(spec.get("holderIdentity") or ""),
            str(spec.get("renewTime") or ""),
            int(spec.get("leaseTransitions") or 0),
            str(spec.get("acquireTime") or ""),
        )

    def _acquire_or_renew(self) -> bool:
        """One try (client-go's tryAcquireOrRenew); True while this replica holds it."""
        s = self.s
        now_text, now = _now_text(), self.clock()
        try:
            lease = self.api.get(s.namespace, s.name)
            if lease is None:
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": s.name, "namespace": s.namespace},
                    "spec": {
                        "holderIdentity": s.identity,
                        "leaseDurationSeconds": int(round(s.lease_duration)),
                        "acquireTime": now_text,
                        "renewTime": now_text,
                        "leaseTransitions": 0,
                    },
                }
                created = self.api.create(s.namespace, body)
                self._saw(self._record(created), now)
                self._renewed = now
                return True
            record = self._record(lease)
            if record != self._observed:
                self._saw(record, now)
            holder, _, transitions, acquired = record
            mine = holder == s.identity
            if holder and not mine and self._observed_at + s.lease_duration > now:
                return False  # held by another, not expired as this replica sees it
            spec = dict(lease.get("spec") or {})
            spec.update(
                {
                    "holderIdentity": s.identity,
                    "leaseDurationSeconds": int(round(s.lease_duration)),
                    "renewTime": now_text,
                    "acquireTime": acquired if mine else now_text,
                    "leaseTransitions": transitions if mine else transitions + 1,
                }
            )
            body = {**lease, "spec": spec}  # metadata.resourceVersion: the one read
            updated = self.api.replace(s.namespace, s.name, body)
            self._saw(self._record(updated), now)
            self._renewed = now
            return True
        except Exception as exc:
            status = getattr(exc, "status", None)
            if status == 409:  # another candidate wrote first: read again next time
                self.conflicts += 1
            else:
                self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:300]
            if self._leading:
                log.warning("leader election: renewing the Lease failed: %s", self.last_error)
            else:
                log.debug("leader election: %s", self.last_error)
            return False

    def _saw(self, record: tuple[str, str, int, str], now: float) -> None:
        self._observed, self._observed_at = record, now
        self.holder = record[0]

    def _release(self) -> None:
        """Empty the holder so a candidate takes the Lease at once (client-go's
        ReleaseOnCancel)."""
        s = self.s
        try:
            lease = self.api.get(s.namespace, s.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != s.identity:
                return
            spec = dict(lease.get("spec") or {})
            now_text = _now_text()
            spec.update(
                {
                    "holderIdentity": "",
                    "leaseDurationSeconds": 1,
                    "renewTime": now_text,
                    "acquireTime": now_text,
                }
            )
            self.api.replace(s.namespace, s.name, {**lease, "spec": spec})
            self.events["released"] += 1
            self.holder = ""
            log.info("leader election: %s released the Lease", s.identity)
        except Exception as exc:  # it expires by itself within lease duration
            log.warning("leader election: releasing the Lease failed: %s", exc)
