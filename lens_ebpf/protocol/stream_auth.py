"""Who may call the two gRPC ports: an agent's reporter on the collector port (the
recorder's and `lens-ebpf collect`'s), a subscriber on the agent's port.

A caller presents a bearer token in its metadata (`authorization: Bearer <token>`):
- a line of `grpc.auth.tokens_file` (`<name> <token>`; on the collector port the name is
  the node the token reports for, `<cluster>/<node>` for another cluster's), or
- a Kubernetes ServiceAccount token, which the service's verify function checks (the API
  server's TokenReview, k8s/tokenreview.py: on the collector port, the agent's account
  bound to a pod on the stream's node; on the agent's port, an allowed account). Its
  verdicts are cached for cache_seconds (never beyond the token's own expiry).
A call without a token is taken only as `anonymous` says (loopback: only while the port
listens on loopback, as the recorder's POST routes). A refusal answers UNAUTHENTICATED (no
or an invalid token), PERMISSION_DENIED (a valid one that may not do this) or UNAVAILABLE
(the API server did not answer: the caller tries again), counted by code and logged once
per peer address.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import grpc
from pydantic import Field, field_validator

from lens_ebpf.core.settings import Section

log = logging.getLogger(__name__)

# verdicts kept at most this many (tokens, each with its claim); the oldest go first
CACHE_ENTRIES = 4096
# a refusal is kept this long at most: a token refused now (a pod not yet scheduled) may
# be taken soon, and a flood of one bad token costs one review per interval
REFUSAL_CACHE_SECONDS = 10.0
# TokenReviews in flight at once, per port
REVIEWS_IN_FLIGHT = 8
PEERS_LOGGED = 10_000  # peer addresses whose refusal was logged (then: counted only)


class StreamAuthConfig(Section):
    tokenreview: bool = True  # ServiceAccount tokens checked with the API's TokenReview
    audience: str = ""  # the audience the tokens are minted for; "": the API server's
    # allowed: namespace/name, or a name in the service's own namespace
    service_accounts: list[str] = Field(default_factory=list)
    tokens_file: str = ""  # static tokens, a line each: "<name> <token>"; "": none
    cache_seconds: float = Field(60.0, ge=0, le=3600)
    # a call without a token: loopback (taken while the port listens on loopback only),
    # always, never
    anonymous: Literal["loopback", "always", "never"] = "loopback"

    @field_validator("service_accounts")
    @classmethod
    def _accounts(cls, v: list[str]) -> list[str]:
        for sa in v:
            ns, sep, name = sa.partition("/")
            if not ns or (sep and not name) or "/" in name:
                raise ValueError(f"{sa!r}: want namespace/name or a name")
        return v

    def accounts(self, namespace: str) -> list[str]:
        """service_accounts as namespace/name, a bare name in namespace (the service's)."""
        return [sa if "/" in sa else f"{namespace}/{sa}" for sa in self.service_accounts]


class CollectorAuthConfig(StreamAuthConfig):
    """The collector port: the agents' ServiceAccount (deploy/agent, in the recorder's
    namespace), its tokens minted for lens-ebpf-collector (the DaemonSet's projected
    volume)."""

    audience: str = "lens-ebpf-collector"
    service_accounts: list[str] = Field(default_factory=lambda: ["lens-ebpf"])


class SubscriberAuthConfig(StreamAuthConfig):
    """The agent's port: the recorder's ServiceAccount (deploy/recorder, in the agent's
    namespace) by default."""

    audience: str = "lens-ebpf-agent"
    service_accounts: list[str] = Field(default_factory=lambda: ["lens-ebpf-recorder"])


class RefusedError(Exception):
    def __init__(self, code: grpc.StatusCode, why: str) -> None:
        super().__init__(why)
        self.code, self.why = code, why


@dataclass(frozen=True)
class Claim:
    """What a call says it is for: the node (and its cluster, "" the home one) a reporter
    reports for; nothing on the agent's port."""

    node: str = ""
    cluster: str = ""


class Checked(Protocol):
    """What a verify function answers (k8s/tokenreview.py's Verdict)."""

    @property
    def result(self) -> str: ...  # ok, unauthenticated, permission_denied, unavailable

    @property
    def why(self) -> str: ...

    @property
    def identity(self) -> str: ...


Verify = Callable[[str, Claim], Checked]  # (token, claim) -> verdict; blocking
CODES = {
    "unauthenticated": grpc.StatusCode.UNAUTHENTICATED,
    "permission_denied": grpc.StatusCode.PERMISSION_DENIED,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
}


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def listen_host(listen: str) -> str:
    """HOST of HOST:PORT ("" for :PORT and the forms gRPC parses itself, unix: ...)."""
    host, sep, port = listen.rpartition(":")
    return host.strip("[]") if sep and port.isdigit() else ""


def bearer(meta: dict[str, str]) -> str:
    """The bearer token of a call's metadata; "" when it has none."""
    scheme, _, token = str(meta.get("authorization", "")).partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def expires_in(token: str, now: Callable[[], float] = time.time) -> float | None:
    """Seconds until a JWT's exp (read, not verified: only to cache no longer); None when
    the token says none."""
    try:
        part = token.split(".")[1]
        exp = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))["exp"]
        return float(exp) - now()
    except (IndexError, ValueError, KeyError, TypeError, binascii.Error):
        return None


class TokensFile:
    """`<name> <token>` lines of a file, read again when it changes (a mounted Secret's
    update); the last good reading kept while it cannot be read."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._entries: list[tuple[str, bytes]] = []
        self._stamp: tuple[float, int] | None = None
        self._warned = ""
        self._lock = threading.Lock()

    def entries(self) -> list[tuple[str, bytes]]:
        if not self.path:
            return []
        with self._lock:
            try:
                st = os.stat(self.path)
                if (st.st_mtime, st.st_size) != self._stamp:
                    with open(self.path) as f:
                        text = f.read()
                    self._stamp = (st.st_mtime, st.st_size)
                    self._entries = self._parse(text)
            except OSError as exc:
                if str(exc) != self._warned:
                    log.warning("grpc.auth.tokens_file: %s", exc)
                    self._warned = str(exc)
            return list(self._entries)

    def _parse(self, text: str) -> list[tuple[str, bytes]]:
        out = []
        for n, line in enumerate(text.splitlines(), 1):
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            if len(fields) != 2:
                log.warning("grpc.auth.tokens_file %s line %d: want '<name> <token>'", self.path, n)
                continue
            out.append((fields[0], fields[1].encode()))
        return out

    def holder(self, token: str) -> list[str]:
        """The names the token is given to (compared in constant time, each line)."""
        given = token.encode()
        return [name for name, t in self.entries() if hmac.compare_digest(given, t)]


class Guard:
    """One port's admission: anonymous calls, the tokens file, verify (TokenReview) with its
    cache; the refusals counted by code (refused) and logged once per peer address.

    node_bound: a token must be its claim's node's (the collector port); home: the cluster
    a tokens-file name without a cluster is (the recorder's home one)."""

    def __init__(
        self,
        cfg: StreamAuthConfig,
        listen: str,
        what: str,
        verify: Verify | None = None,
        node_bound: bool = False,
        home: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg, self.what, self.verify = cfg, what, verify
        self.node_bound, self.home, self.clock = node_bound, home, clock
        self.anonymous = cfg.anonymous == "always" or (
            cfg.anonymous == "loopback" and loopback(listen_host(listen))
        )
        self.tokens = TokensFile(cfg.tokens_file)
        self.refused: collections.Counter[str] = collections.Counter()
        self._cache: collections.OrderedDict[tuple[bytes, Claim], tuple[float, Checked]] = (
            collections.OrderedDict()
        )
        self._logged: set[str] = set()
        self._lock = threading.Lock()
        self._reviews: asyncio.Semaphore | None = None  # made on the serving loop
        self.listen = listen
        self.refuses_all = not (self.anonymous or cfg.tokens_file or verify)

    def announce(self) -> None:
        """Once its port serves: a warning where every call will be refused (not at bind,
        which may still fail on another port, the service's one error line)."""
        if self.refuses_all:
            log.warning(
                "%s: calls without a token are refused (%s listens beyond loopback) "
                "and none can be checked (no TokenReview: grpc.auth.tokenreview off "
                "or no Kubernetes API; no grpc.auth.tokens_file): every call is "
                "refused",
                self.what,
                self.listen,
            )

    async def admit(self, context: Any, claim: Claim) -> str:
        """Who the caller is ("anonymous" where it may be); else the call is aborted with
        the refusal's code (context.abort raises)."""
        meta = {str(k).lower(): v for k, v in (context.invocation_metadata() or ())}
        try:
            return await self.check(bearer(meta), claim)
        except RefusedError as r:
            self._refuse(str(context.peer() or ""), r, claim)
            await context.abort(r.code, r.why)
            raise  # abort raises; for the type checker

    async def check(self, token: str, claim: Claim) -> str:
        """Who a token is for this claim; RefusedError when it may not."""
        if not token:
            if self.anonymous:
                return "anonymous"
            raise RefusedError(
                grpc.StatusCode.UNAUTHENTICATED,
                f"{self.what}: no bearer token (metadata 'authorization: Bearer "
                "<token>'); see docs/security.md",
            )
        names = self.tokens.holder(token) if self.cfg.tokens_file else []
        if names:
            return self._static(names, claim)
        if self.verify is None:
            raise RefusedError(
                grpc.StatusCode.UNAUTHENTICATED,
                f"{self.what}: the token is none of grpc.auth.tokens_file's and no "
                "TokenReview checks ServiceAccount tokens here",
            )
        verdict = await self._verified(token, claim)
        if verdict.result == "ok":
            return verdict.identity
        raise RefusedError(
            CODES.get(verdict.result, grpc.StatusCode.UNAUTHENTICATED),
            f"{self.what}: {verdict.why}",
        )

    def _static(self, names: list[str], claim: Claim) -> str:
        if not self.node_bound:
            return names[0]
        mine = {f"{claim.cluster or self.home}/{claim.node}"}
        if claim.cluster in ("", self.home):
            mine.add(claim.node)
        for name in names:
            if name in mine:
                return name
        raise RefusedError(
            grpc.StatusCode.PERMISSION_DENIED,
            f"{self.what}: the token is {names[0]}'s (grpc.auth.tokens_file), not "
            f"node {claim.node!r}'s",
        )

    async def _verified(self, token: str, claim: Claim) -> Checked:
        assert self.verify is not None
        key = (hashlib.sha256(token.encode()).digest(), claim)
        now = self.clock()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0] > now:
                return hit[1]
        if self._reviews is None:
            self._reviews = asyncio.Semaphore(REVIEWS_IN_FLIGHT)
        async with self._reviews:
            verdict = await asyncio.to_thread(self.verify, token, claim)
        keep = (
            self.cfg.cache_seconds
            if verdict.result == "ok"
            else min(self.cfg.cache_seconds, REFUSAL_CACHE_SECONDS)
        )
        left = expires_in(token)
        if left is not None:
            keep = min(keep, left)
        if verdict.result != "unavailable" and keep > 0:
            with self._lock:
                self._cache[key] = (self.clock() + keep, verdict)
                self._cache.move_to_end(key)
                while len(self._cache) > CACHE_ENTRIES:
                    self._cache.popitem(last=False)
        return verdict

    def _refuse(self, peer: str, r: RefusedError, claim: Claim) -> None:
        # ipv4:10.0.0.5:41234, ipv6:[::1]:41234: the address without the port
        addr = peer.rpartition(":")[0] or peer
        with self._lock:
            self.refused[r.code.name.lower()] += 1
            first = addr not in self._logged and len(self._logged) < PEERS_LOGGED
            if first:
                self._logged.add(addr)
        if first:
            node = f" for node {claim.node!r}" if claim.node else ""
            log.warning(
                "%s refused a call from %s%s: %s: %s (its further refusals are "
                "counted, not logged)",
                self.what,
                addr or "?",
                node,
                r.code.name,
                r.why,
            )
