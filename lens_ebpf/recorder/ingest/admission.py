"""Who may POST to the recorder (log lines, remote write), what a POST came to, and the
POST routes' counts.

Every POST route takes a bearer token, read from `recorder.ingest.token_file` (read again
when the file changes, as a mounted Secret does; while it holds none, every POST gets 401
saying so, and the rest of the service runs). Without a token file, POSTs are taken
only while the service listens on loopback, or where `ingest.allow_anonymous` says so,
and then only from this service's own site: a browser's page elsewhere (its Origin) or
a name rebound to this address (its Host) gets 403. A wrong or missing token gets 401,
a body of a type the route does not take 415, each counted per route; all of it judged
on the request's head, before its body is read. The HTTP surface (recorder/api/posts.py)
puts each Outcome in the cluster API's envelope.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from lens_ebpf.core.exposition import Buckets, counter, histogram
from lens_ebpf.recorder.config import ApiConfig, IngestConfig

log = logging.getLogger(__name__)

SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class Outcome:
    """What a POST came to: the HTTP status it answers, its message and data, and headers
    of its own (Retry-After, what remote write 2.0 says was written)."""

    status: int
    message: str = "OK"
    data: Any = None
    headers: dict[str, str] = field(default_factory=dict)


def loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _name(host: str) -> str:
    """A Host header's (or an Origin's netloc's) name, without its port or brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def cross_site(headers: Mapping[str, str], hosts: tuple[str, ...] = ()) -> str | None:
    """Why a write that carries no credentials may be a browser's on another site's
    behalf (None when it is not): its Host names neither an address, localhost nor one
    of hosts (a name an attacker's DNS points here: rebinding), or its Origin is not
    the Host it was sent to (a page elsewhere: cross-site). Clients that are no browser
    send no Origin; what a browser sends it cannot forge."""
    host = headers.get("host", "")
    name, allowed = _name(host), {h.lower() for h in hosts}
    if not (_literal(name) or name == "localhost" or name in allowed or host.lower() in allowed):
        return (
            f"Host {host!r} is not this service's: a write without credentials is taken "
            "only for an address, localhost or a name of its anonymous_hosts"
        )
    origin = headers.get("origin")
    if origin is None:
        return None
    netloc = urlsplit(origin).netloc.lower() if origin.lower() != "null" else ""
    if netloc and (netloc == host.lower() or netloc in allowed or _name(netloc) in allowed):
        return None
    return (
        f"Origin {origin!r} is not this service's ({host}): a write without credentials "
        "is taken only from the service's own pages"
    )


class Ingest(Collector):
    def __init__(self, cfg: IngestConfig, listen_host: str, home: str = "local") -> None:
        self.path = cfg.token_file
        self.home = home  # the cluster whose pods the POST routes read
        self.anonymous = cfg.allow_anonymous or loopback(listen_host)
        self.hosts = tuple(cfg.anonymous_hosts)  # names anonymous writes may be sent to
        self._token = ""
        self._stamp: tuple[float, int] | None = None
        self._warned = False
        self._lock = threading.Lock()
        self.unauthorized: dict[str, int] = {}
        self.cross_site: dict[str, int] = {}  # anonymous POSTs refused for their Origin/Host
        self.requests: dict[tuple[str, int], int] = {}
        self.seconds: dict[str, Buckets] = {}
        if self.path:
            if not self.token():
                log.warning(
                    "recorder: recorder.ingest.token_file %s holds no token yet: "
                    "POST routes answer 401 until it does",
                    self.path,
                )
        elif not self.anonymous:
            log.warning(
                "recorder: no recorder.ingest.token_file and listening beyond "
                "loopback: POST routes answer 401 (set a token, or "
                "ingest.allow_anonymous: true)"
            )

    def token(self) -> str:
        """The token now: the file read again when it changed (a Secret's new token); the
        last one kept while it cannot be read; "" before it ever could."""
        with self._lock:
            try:
                st = os.stat(self.path)
                if (st.st_mtime, st.st_size) != self._stamp:
                    with open(self.path) as f:
                        self._token = f.read().strip() or self._token
                    self._stamp = (st.st_mtime, st.st_size)
            except OSError as exc:
                if self._stamp is not None or not self._warned:
                    log.warning("recorder: token file: %s", exc)
                self._warned = True
            return self._token

    def refused(self, route: str, headers: dict[str, str]) -> Outcome | None:
        """401 for a request without the token (or any, where no token is set and anonymous
        POSTs are not taken); None when it may go on."""
        if self.path:
            scheme, _, given = headers.get("authorization", "").partition(" ")
            token = self.token()
            if (
                token
                and scheme.lower() == "bearer"
                and hmac.compare_digest(given.strip().encode(), token.encode())
            ):
                return None
            bearer = scheme.lower() == "bearer" and given.strip()
            why = "a wrong bearer token" if bearer else "no bearer token (Authorization: Bearer)"
            if not token:
                why = f"recorder.ingest.token_file {self.path} holds no token (yet)"
        elif self.anonymous:
            foreign = cross_site(headers, self.hosts)
            if foreign is None:
                return None
            with self._lock:
                self.cross_site[route] = self.cross_site.get(route, 0) + 1
            return Outcome(403, f"{route}: {foreign}")
        else:
            why = (
                "no recorder.ingest.token_file is set and the service listens beyond "
                "loopback (set a token, or ingest.allow_anonymous: true)"
            )
        with self._lock:
            self.unauthorized[route] = self.unauthorized.get(route, 0) + 1
        return Outcome(401, f"{route}: {why}")

    def elsewhere(self, route: str, asked: str) -> Outcome | None:
        """404 for a body of another cluster (?cluster=): the POST routes read the home
        cluster's pods; another cluster's senders post to a service of their own."""
        if asked and asked != self.home:
            return Outcome(
                404, f"{route}: this service takes cluster {self.home!r}'s only, " f"not {asked!r}"
            )
        return None

    def count(self, route: str, status: int, seconds: float) -> None:
        """A POST answered: counted by route and status, its time observed."""
        with self._lock:
            key = (route, status)
            self.requests[key] = self.requests.get(key, 0) + 1
            self.seconds.setdefault(route, Buckets(SECONDS_BUCKETS)).observe(seconds)

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            requests = sorted(self.requests.items())
            unauthorized = sorted(self.unauthorized.items())
            foreign_routes = sorted(self.cross_site.items())
            seconds = sorted((k, b.copy()) for k, b in self.seconds.items())
        fam = counter("lens_recorder_post_requests", "POST requests, by route and HTTP status")
        for (route, status), n in requests:
            fam.add({"route": route, "code": str(status)}, n)
        yield fam
        bad = counter(
            "lens_recorder_post_unauthorized",
            "POST requests refused (401): no or a " "wrong bearer token",
        )
        for route, n in unauthorized:
            bad.add({"route": route}, n)
        yield bad
        foreign = counter(
            "lens_recorder_post_cross_site",
            "POST requests without credentials "
            "refused (403): another site's Origin, or a Host not this "
            "service's",
        )
        for route, n in foreign_routes:
            foreign.add({"route": route}, n)
        yield foreign
        hist = histogram("lens_recorder_post_request_seconds", "Time to answer a POST")
        for route, b in seconds:
            hist.add_buckets({"route": route}, b.cumulative(), b.total)
        yield hist


class WriteGuard(Collector):
    """Who may change the cluster API's state (its POST, PUT, PATCH and DELETE routes:
    alerts' rules, silences, channels): a client certificate the service's CA verified
    (server.tls.client_ca), or the bearer token of `recorder.api.token_file`; without a
    token file, writes are taken only while the service listens on loopback, or where
    `api.allow_anonymous` says so, and then only from its own site (cross_site). No
    credentials: 401; a wrong token or another site: 403; a body not JSON: 415; counted
    by route. Reads stay open. Who made a change is who the credentials say (user())."""

    def __init__(self, cfg: ApiConfig, listen_host: str) -> None:
        self.tokens = Ingest(
            IngestConfig(
                token_file=cfg.token_file,
                allow_anonymous=cfg.allow_anonymous,
                anonymous_hosts=cfg.anonymous_hosts,
            ),
            listen_host,
        )
        self.proxy = cfg.forwarded_user_from  # whose X-Forwarded-User is believed
        self.refusals: dict[tuple[str, int], int] = {}
        self.writes: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def refused(
        self, route: str, headers: dict[str, str], certified: bool
    ) -> tuple[int, str] | None:
        """(401 or 403, why) for a write it may not make; None when it may."""
        if certified:
            return None
        t = self.tokens
        scheme, _, given = headers.get("authorization", "").partition(" ")
        bearer = scheme.lower() == "bearer" and given.strip()
        if t.path:
            token = t.token()
            if token and bearer and hmac.compare_digest(given.strip().encode(), token.encode()):
                return None
            got = (
                (403, "a wrong bearer token")
                if bearer and token
                else (401, "no bearer token (Authorization: Bearer) or client certificate")
            )
            if not token:
                got = (401, f"recorder.api.token_file {t.path} holds no token (yet)")
        elif t.anonymous:
            foreign = cross_site(headers, t.hosts)
            if foreign is None:
                return None
            got = (403, foreign)
        else:
            got = (
                401,
                "no recorder.api.token_file is set and the service listens beyond "
                "loopback (set a token, use client certificates, or "
                "api.allow_anonymous: true)",
            )
        return self.refuse(route, *got)

    def refuse(self, route: str, status: int, why: str) -> tuple[int, str]:
        """A write refused (counted by route and status): (status, the message)."""
        with self._lock:
            key = (route, status)
            self.refusals[key] = self.refusals.get(key, 0) + 1
        return status, f"{route}: {why}"

    def user(self, headers: Mapping[str, str], certified: bool, subject: str) -> str:
        """Who a write is made by: its client certificate's subject, "token" (the API's
        bearer token) or "anonymous"; the user a proxy names (X-Forwarded-User,
        X-Remote-User) only where the write comes with recorder.api.forwarded_user_from's
        credentials ("token", or "cert:<subject>"), as the UI's proxy presents them."""
        if certified:
            who, said = subject or "certificate", f"cert:{subject}"
        elif self.tokens.path:
            who = said = "token"
        else:
            who, said = "anonymous", ""
        named = headers.get("x-forwarded-user") or headers.get("x-remote-user") or ""
        if named and self.proxy and said == self.proxy:
            return named[:253]
        return who[:253]

    def count(self, route: str, status: int) -> None:
        with self._lock:
            self.writes[(route, status)] = self.writes.get((route, status), 0) + 1

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            refusals, writes = sorted(self.refusals.items()), sorted(self.writes.items())
        bad = counter(
            "lens_recorder_api_writes_refused",
            "Writes to the cluster API refused: "
            "401 (no credentials), 403 (a wrong token, or another site's without "
            "credentials), 415 (a body not JSON), by route",
        )
        for (route, code), n in refusals:
            bad.add({"route": route, "code": str(code)}, n)
        yield bad
        done = counter(
            "lens_recorder_api_writes",
            "Writes to the cluster API answered, by " "route and HTTP status",
        )
        for (route, code), n in writes:
            done.add({"route": route, "code": str(code)}, n)
        yield done
