"""Prometheus remote write on the wire (pure): which version a request speaks, its snappy
body unpacked within a bound, and protobuf bytes written directly where the copies are
built (a WriteRequest is its TimeSeries fields one after another, a TimeSeries its Label
fields and the rest, so a copy is new label bytes before the original's samples).

Versions: 1.0, `Content-Type: application/x-protobuf` (optionally
`;proto=prometheus.WriteRequest`), `X-Prometheus-Remote-Write-Version: 0.1.0`; 2.0,
`Content-Type: application/x-protobuf;proto=io.prometheus.write.v2.Request`,
`X-Prometheus-Remote-Write-Version: 2.0.0`. Both `Content-Encoding: snappy` (block
format).
"""

from __future__ import annotations

from dataclasses import dataclass

import cramjam

V1, V2 = 1, 2
PROTOS = {"prometheus.WriteRequest": V1, "io.prometheus.write.v2.Request": V2}
CONTENT_TYPES = {
    V1: "application/x-protobuf",
    V2: "application/x-protobuf;proto=io.prometheus.write.v2.Request",
}
VERSIONS = {V1: "0.1.0", V2: "2.0.0"}


class WireError(Exception):
    """A request the service does not take: 400 (a sender must not retry it), 413, 415."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def version(headers: dict[str, str]) -> int:
    """The remote write version a request's headers say (V1 or V2); WireError 415 for
    anything else."""
    ctype = headers.get("content-type", "application/x-protobuf")
    base, *params = (p.strip() for p in ctype.split(";"))
    if base.lower() != "application/x-protobuf":
        raise WireError(415, f"Content-Type {ctype!r}: application/x-protobuf (remote write)")
    proto = "prometheus.WriteRequest"
    for p in params:
        key, _, value = p.partition("=")
        if key.strip().lower() == "proto":
            proto = value.strip().strip('"')
    if proto not in PROTOS:
        raise WireError(
            415,
            f"Content-Type proto={proto}: prometheus.WriteRequest (1.0) or "
            "io.prometheus.write.v2.Request (2.0)",
        )
    got = PROTOS[proto]
    enc = headers.get("content-encoding", "")
    if enc.strip().lower() != "snappy":
        raise WireError(415, f"Content-Encoding {enc!r}: remote write bodies are snappy")
    said = headers.get("x-prometheus-remote-write-version", "")
    if said and not said.startswith("0.1." if got == V1 else "2."):
        raise WireError(
            415,
            f"X-Prometheus-Remote-Write-Version {said!r} with "
            f"proto={proto}: {VERSIONS[got]} expected",
        )
    return got


def uvarint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_uvarint(data: bytes, pos: int = 0) -> tuple[int, int]:
    """(value, the position after it); ValueError for a truncated or overlong one."""
    n = shift = 0
    while pos < len(data) and shift < 64:
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, pos
        shift += 7
    raise ValueError("a truncated varint")


def unsnappy(body: bytes, most: int) -> bytes:
    """A snappy block, unpacked: 413 when its header says more than most bytes (read
    before anything is unpacked), 400 when it is not snappy."""
    try:
        size, _ = read_uvarint(body)
    except ValueError:
        raise WireError(400, "not snappy: no length preamble") from None
    if size > most:
        raise WireError(413, f"body of {size} bytes once unpacked: over {most}")
    try:
        out = bytes(cramjam.snappy.decompress_raw(body))
    except Exception as exc:  # cramjam raises its own DecompressionError
        raise WireError(400, f"not snappy: {exc}") from None
    if len(out) != size:
        raise WireError(400, f"not snappy: {len(out)} bytes where the preamble said {size}")
    return out


def snappy(data: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(data))


def field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field: its tag byte (field number << 3 | 2), length, bytes."""
    return bytes((tag,)) + uvarint(len(payload)) + payload


def label(name: str, value: str) -> bytes:
    """One Label as a TimeSeries' field 1."""
    n, v = name.encode(), value.encode()
    return field(0x0A, field(0x0A, n) + field(0x12, v))


def labels(pairs: dict[str, str]) -> bytes:
    """A TimeSeries' labels, sorted by name as the protocol asks."""
    return b"".join(label(k, pairs[k]) for k in sorted(pairs))


def timeseries(label_bytes: bytes, rest: bytes) -> bytes:
    """A WriteRequest's field 1: a TimeSeries of these labels and the rest of a series (its
    samples, exemplars and histograms, serialized without its labels)."""
    return field(0x0A, label_bytes + rest)


@dataclass
class Counts:
    samples: int = 0
    histograms: int = 0
    exemplars: int = 0
