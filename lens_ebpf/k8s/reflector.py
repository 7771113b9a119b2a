"""List then watch one API collection, as client-go's reflector does.

The list gives a full snapshot and a resourceVersion; the watch streams changes from
there (ADDED, MODIFIED, DELETED, and BOOKMARK events that only move the version on).
A watch that ends (server timeout, dropped connection) resumes from the last version
seen; one the server refuses with 410 Gone (the version was compacted away) lists
again. Errors back off exponentially with jitter, and what the index holds stays
in place meanwhile.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.core import Metric

from lens_ebpf.core.backoff import Backoff
from lens_ebpf.core.exposition import counter, gauge

log = logging.getLogger(__name__)

ListFn = Callable[..., Any]
PAGE = 500


def call_raw(fn: Callable[..., Any], *args: Any, timeout: float, **kwargs: Any) -> dict[str, Any]:
    """One kubernetes client call answered as the API's own JSON (no model objects)."""
    resp = fn(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
    doc = json.loads(resp.data)
    if not isinstance(doc, dict):
        raise ValueError(f"{getattr(fn, '__name__', 'call')}: answer is not a JSON object")
    return doc


def describe(exc: Exception) -> str:
    """A failure in one line: an API answer as its status, reason and the Status's message
    (the client's text is mostly its response headers), anything else as it says."""
    status = getattr(exc, "status", None)
    if status is not None and hasattr(exc, "body"):
        try:
            message = json.loads(exc.body or "{}").get("message", "")
        except (ValueError, TypeError, AttributeError):
            message = ""
        return f"{type(exc).__name__}: {status} {getattr(exc, 'reason', '')}: {message}"[:300]
    return f"{type(exc).__name__}: {exc}"[:300]


class Gone(Exception):
    """410: the resourceVersion asked for is too old; list again."""


class Reflector:
    """Keeps callbacks fed from one collection until stop is set."""

    def __init__(
        self,
        resource: str,
        list_fn: ListFn,
        on_replace: Callable[[list[dict[str, Any]]], None],
        on_event: Callable[[str, dict[str, Any]], None],
        *,
        request_timeout: float = 10.0,
        watch_timeout: float = 300.0,
        backoff_max: float = 30.0,
    ) -> None:
        self.resource = resource
        self.list_fn = list_fn
        self.on_replace = on_replace
        self.on_event = on_event
        self.request_timeout = request_timeout
        self.watch_timeout = watch_timeout
        self.backoff_max = backoff_max
        self.resource_version = ""
        self.connected = False
        self.synced = threading.Event()  # set after the first full list
        self.lists = 0
        self.restarts: dict[str, int] = {"gone": 0, "error": 0, "ended": 0}
        self.events: dict[str, int] = {}
        self.last_error = ""
        self.last_heard = 0.0  # time.monotonic() of the last list, event or bookmark
        self._resp: Any = None
        self._stopping = False  # stop() was called: a watch that opens now ends at once

    def run(self, stop: threading.Event) -> None:
        """List and watch until stop is set (a Reflector stopped may run again: its
        resourceVersion resumes the watch)."""
        self._stopping = False  # this run's stop is `stop` (and a stop() from now on)
        backoff = Backoff(self.backoff_max)
        while not stop.is_set():
            try:
                if not self.resource_version:
                    self._list()
                self._watch(stop)
                self.restarts["ended"] += 1
                backoff.reset()
            except Exception as exc:  # API down, reset, bad answer: keep the index, retry
                if stop.is_set():
                    break  # stop() cut the watch
                if isinstance(exc, Gone) or getattr(exc, "status", None) == 410:
                    # the version was compacted away (an ERROR event or an HTTP 410)
                    self.restarts["gone"] += 1
                    log.info(
                        "k8s %s: resourceVersion %s expired; listing again",
                        self.resource,
                        self.resource_version,
                    )
                    self.resource_version = ""
                    continue
                self.connected = False
                self.restarts["error"] += 1
                self.last_error = describe(exc)
                wait = backoff.next()
                log.warning("k8s %s: %s; retrying in %.1fs", self.resource, self.last_error, wait)
                stop.wait(wait)
        self.connected = False

    def stop(self) -> None:
        """Unblock a watch waiting on the network (one that opens after this ends at once:
        a watch whose answer had not come yet would wait for its timeout otherwise)."""
        self._stopping = True
        resp = self._resp
        if resp is not None:
            try:
                resp.shutdown()
            except Exception:  # urllib3 < 2.3 has no shutdown(); the read timeout ends it
                log.debug("k8s %s: could not cut the watch", self.resource)

    def _list(self) -> None:
        items: list[dict[str, Any]] = []
        token = None
        while True:
            doc = call_raw(self.list_fn, limit=PAGE, _continue=token, timeout=self.request_timeout)
            items.extend(i for i in doc.get("items") or () if isinstance(i, dict))
            meta = doc.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                break
        self.on_replace(items)
        self.resource_version = str(meta.get("resourceVersion", ""))
        self.lists += 1
        self.last_heard = time.monotonic()
        self.connected = True
        self.synced.set()

    def _watch(self, stop: threading.Event) -> None:
        from kubernetes.watch.watch import iter_resp_lines  # standalone agents never load it

        resp = self.list_fn(
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=int(self.watch_timeout),
            _preload_content=False,
            _request_timeout=(self.request_timeout, self.watch_timeout + 30),
        )
        self._resp = resp
        self.connected = True
        ended = False  # the server ended the stream: the connection can serve again
        try:
            if self._stopping or stop.is_set():  # stop() came while it opened
                return
            for line in iter_resp_lines(resp):
                if stop.is_set():
                    return
                if line:
                    self._handle(json.loads(line))
            ended = True
        finally:
            self._resp = None
            if not ended:  # a stream left unread would be the next request's answer
                resp.close()
            resp.release_conn()

    def _handle(self, event: dict[str, Any]) -> None:
        kind = str(event.get("type", ""))
        obj = event.get("object")
        if not isinstance(obj, dict):
            raise ValueError(f"watch event {kind!r} without an object")
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone(obj.get("message", ""))
            raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message', '')}")
        self.events[kind] = self.events.get(kind, 0) + 1
        self.last_heard = time.monotonic()
        if kind != "BOOKMARK":
            self.on_event(kind, obj)
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self.resource_version = str(rv)


def watch_metrics(
    reflectors: Iterable[Reflector], connected: str, restarts: str, events: str
) -> list[Metric]:
    """Each watch's health by resource, in the families named (written out by each caller,
    so that a metric's name finds its source): connected, restarts{reason}, events{type}."""
    up = gauge(connected, "1 while the watch is connected")
    again = counter(restarts, "Watches restarted, by why")
    seen = counter(events, "Watch events by type")
    for r in reflectors:
        res = {"resource": r.resource}
        up.add(res, 1 if r.connected else 0)
        for why, n in r.restarts.items():
            again.add({**res, "reason": why}, n)
        for kind, n in sorted(r.events.items()):
            seen.add({**res, "type": kind}, n)
    return [up, again, seen]
