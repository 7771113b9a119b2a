"""What log shippers POST, as log lines of pods (pure: bytes in, lines out).

- Fluent Bit's `http` output, `format json` (an array of records) or `json_lines`: the
  line under `log` or `message`, its time under `date` (unix seconds, Fluent Bit's
  default `json_date_format double`, or an ISO 8601 string), `time`, `@timestamp` or
  `timestamp`, and the `kubernetes` filter's `namespace_name`, `pod_name`,
  `container_name`, `pod_id`.
- Vector's `http` sink, `codec json` (an array, or one event a line): `message`,
  `timestamp` (RFC 3339), and its kubernetes_logs source's `kubernetes.pod_namespace`,
  `pod_name`, `container_name`, `pod_uid`.
- Plain lines, one a line, of the pod named by `?namespace=&pod=&container=` (its time:
  when it arrived).

A body may be gzip'd (`Content-Encoding: gzip`, or gzip's magic bytes). A record that is
no object, lacks a line or a pod, or has a time that does not parse is counted and
skipped; the rest are kept.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from lens_ebpf.recorder.errors import BadRequest
from lens_ebpf.recorder.inputs import loads, shown
from lens_ebpf.recorder.lifecycle import parse_time


class BodyError(Exception):
    """A body the service does not take: status (400, 413, 415) and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class LogLine:
    at: datetime | None  # None: the record gave no time (plain lines): when it arrived
    namespace: str
    pod: str
    container: str
    pod_uid: str
    text: str


@dataclass
class Lines:
    shipper: str  # fluent-bit, vector, plain
    lines: list[LogLine] = field(default_factory=list)
    malformed: int = 0  # records skipped
    why: str = ""  # the first skipped record's reason


def gunzip(body: bytes, encoding: str, most: int) -> bytes:
    """body, gunzipped when it says so or is (gzip's magic); 413 once it would pass most
    bytes (a small body may unpack to gigabytes), 400 when it is not gzip after all."""
    enc = encoding.strip().lower()
    if enc not in ("", "identity", "gzip", "x-gzip"):
        raise BodyError(415, f"Content-Encoding {encoding!r}: gzip or none")
    if enc in ("", "identity") and not body.startswith(b"\x1f\x8b"):
        return body
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(body, most + 1)
        if len(out) > most or d.unconsumed_tail:
            raise BodyError(413, f"body over {most} bytes once gunzipped")
        out += d.flush()
        if len(out) > most:
            raise BodyError(413, f"body over {most} bytes once gunzipped")
    except zlib.error as exc:
        raise BodyError(400, f"not gzip: {exc}") from None
    if not d.eof:
        raise BodyError(400, "gzip stream cut short")
    return out


TIME_KEYS = ("date", "time", "@timestamp", "timestamp")


def record_time(rec: dict[str, Any]) -> datetime | None:
    """The record's time (None when it has none); ValueError when it has one that does not
    parse."""
    for key in TIME_KEYS:
        v = rec.get(key)
        if v is None or v == "":
            continue
        if isinstance(v, bool) or not isinstance(v, int | float | str):
            raise ValueError(f"{key}: {type(v).__name__}, not unix seconds or ISO 8601")
        if isinstance(v, int | float):
            try:
                return datetime.fromtimestamp(float(v), UTC)
            except (OverflowError, OSError, ValueError):
                raise ValueError(f"{key}={v!r}: not a time (out of range)") from None
        got = parse_time(v)
        if got is None:
            raise ValueError(f"{key}={shown(v)}: not unix seconds or ISO 8601")
        return got
    return None


def record_lines(rec: Any) -> tuple[str, list[LogLine]]:
    """(shipper, the record's lines); ValueError saying why it is skipped."""
    if not isinstance(rec, dict):
        raise ValueError(f"a record is a JSON object, not {type(rec).__name__}")
    text = rec.get("log", rec.get("message"))
    if not isinstance(text, str):
        raise ValueError("no log or message string")
    k8s = rec.get("kubernetes")
    if not isinstance(k8s, dict):
        raise ValueError("no kubernetes object (the shipper's Kubernetes metadata)")
    if "pod_namespace" in k8s:  # Vector's kubernetes_logs
        shipper, ns, uid = "vector", k8s.get("pod_namespace"), k8s.get("pod_uid", "")
    else:  # Fluent Bit's kubernetes filter
        shipper, ns, uid = "fluent-bit", k8s.get("namespace_name"), k8s.get("pod_id", "")
    pod, container = k8s.get("pod_name"), k8s.get("container_name", "")
    if not isinstance(ns, str) or not isinstance(pod, str) or not ns or not pod:
        raise ValueError("kubernetes metadata without the pod's namespace and name")
    if not isinstance(container, str | None) or not isinstance(uid, str | None):
        raise ValueError("kubernetes metadata whose container name or pod uid is no string")
    if "\x00" in ns + pod + (container or "") + (uid or ""):  # (PostgreSQL's text takes none)
        raise ValueError("a NUL character in the pod's namespace, name, container or uid")
    at = record_time(rec)
    return shipper, [
        LogLine(at, ns, pod, str(container or ""), str(uid or ""), t)
        for t in text.rstrip("\n").split("\n")
    ]


def parse_body(body: bytes, query: dict[str, str]) -> Lines:
    """The lines of a gunzipped body; BodyError for one that is not any shipper's."""
    ns, pod = query.get("namespace", ""), query.get("pod", "")
    if ns or pod:
        if not ns or not pod:
            raise BodyError(400, "plain lines need both namespace= and pod=")
        try:
            text = body.decode()
        except UnicodeDecodeError as exc:
            raise BodyError(400, f"plain lines are UTF-8: {exc}") from None
        return Lines(
            "plain",
            [
                LogLine(None, ns, pod, query.get("container", ""), query.get("pod_uid", ""), line)
                for line in text.splitlines()
                if line.strip()
            ],
        )
    head = body.lstrip()[:1]
    records: list[Any] = []
    out = Lines("")
    # (parsed as every JSON body is, inputs.loads: nesting bounded, never Python's
    # recursion; what is read below takes only the strings and numbers it expects)
    if head == b"[":
        try:
            got = loads(body, "not a JSON array of records")
        except BadRequest as exc:
            raise BodyError(400, str(exc)) from None
        records = got if isinstance(got, list) else []
    elif head == b"{":  # one record a line (Fluent Bit json_lines, Vector ndjson)
        for raw in body.splitlines():
            if not raw.strip():
                continue
            try:
                records.append(loads(raw, "a line that is not JSON"))
            except BadRequest as exc:
                out.malformed += 1
                out.why = out.why or str(exc)
    elif head:
        raise BodyError(
            400, "neither JSON records nor plain lines (plain lines need " "?namespace=&pod=)"
        )
    for rec in records:
        try:
            shipper, lines = record_lines(rec)
        except ValueError as exc:
            out.malformed += 1
            out.why = out.why or str(exc)
            continue
        out.shipper = out.shipper or shipper
        out.lines += lines
    return out
