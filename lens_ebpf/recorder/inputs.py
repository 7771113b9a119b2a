"""What a client sends, checked where every surface reads it (parameters) or parses it
(JSON bodies), before any of it reaches a handler's work or the database: bad input is a
400 naming the field, never a 5xx (which Alertmanager and Prometheus retry forever).

Refused: a NUL character (PostgreSQL's text cannot hold one), an integer outside 64 bits
(both databases' BIGINT), nesting deeper than MAX_DEPTH (Python's recursion in what
reads it), a number that is not finite (JSON has none; orjson refuses 1e400)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import orjson

from lens_ebpf.recorder.errors import BadRequest

MAX_DEPTH = 32  # the deepest body a route reads is 6 (a metric rule's annotations)
INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1
NUL, REPLACEMENT = "\x00", "\ufffd"


def shown(value: str, most: int = 60) -> str:
    """A client's value as a message quotes it: repr, cut short."""
    text = repr(value)
    return text if len(text) <= most else text[: most - 4] + "...'"


def parameters(params: dict[str, str], query: dict[str, str]) -> None:
    """A request's path and query parameters: BadRequest naming the first that holds a
    NUL character."""
    for got in (params, query):
        for name, value in got.items():
            if NUL in name or NUL in value:
                raise BadRequest(
                    f"{shown(name)}={shown(value)}: a NUL character (\\u0000) is " "not taken"
                )


def whole(raw: Any, name: str, lowest: int = INT_MIN, highest: int = INT_MAX) -> int:
    """A whole number a parameter or body field gives (a JSON integer, or its digits);
    BadRequest naming it when it is not one or lies outside [lowest, highest] (64 bits by
    default)."""
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise BadRequest(f"{name}={shown(str(raw))}: not a whole number")
    text = raw.strip() if isinstance(raw, str) else str(raw)
    digits = text[1:] if text[:1] in "+-" else text
    if not digits.isascii() or not digits.isdigit():
        raise BadRequest(f"{name}={shown(text)}: not a whole number")
    if len(digits) > 19:  # int() of thousands of digits is slow, and refused past 4,300
        raise BadRequest(f"{name}={shown(text)}: out of range ({lowest} to {highest})")
    n = int(text)
    if not lowest <= n <= highest:
        raise BadRequest(f"{name}={n}: out of range ({lowest} to {highest})")
    return n


def unix_time(seconds: float, name: str, raw: str = "") -> datetime:
    """A unix time as an aware datetime; BadRequest naming name when no datetime is (NaN,
    infinite, past year 9999 or before year 1)."""
    try:
        if not math.isfinite(seconds):
            raise ValueError
        return datetime.fromtimestamp(seconds, UTC)
    except (ValueError, OverflowError, OSError):
        raise BadRequest(
            f"{name}={shown(raw or str(seconds))}: not a time (out of range)"
        ) from None


def checked(value: Any, where: str = "", nul: bool = False) -> None:
    """BadRequest naming the first field of a parsed JSON value (a path: `alerts[2].labels.
    x`) that holds a NUL character (unless nul), an integer outside 64 bits, a number that
    is not finite, or lies deeper than MAX_DEPTH."""
    stack: list[tuple[Any, str, int]] = [(value, where, 1)]
    while stack:
        v, at, depth = stack.pop()
        if isinstance(v, str):
            if not nul and NUL in v:
                raise BadRequest(f"{at or 'the body'}: a NUL character (\\u0000) is not taken")
        elif isinstance(v, bool) or v is None:
            continue
        elif isinstance(v, int):
            if not INT_MIN <= v <= INT_MAX:
                raise BadRequest(f"{at or 'the body'}={v}: out of range (a 64-bit integer)")
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise BadRequest(f"{at or 'the body'}: not a finite number")
        elif isinstance(v, dict | list):
            if depth > MAX_DEPTH:
                raise BadRequest(f"{at or 'the body'}: nested deeper than {MAX_DEPTH} levels")
            if isinstance(v, list):
                stack.extend((x, f"{at}[{i}]", depth + 1) for i, x in enumerate(v))
                continue
            for k, x in v.items():
                name = f"{at}.{k}" if at else str(k)
                if not nul and NUL in str(k):
                    raise BadRequest(f"{shown(name)}: a NUL character (\\u0000) is not taken")
                stack.append((x, name, depth + 1))


def loads(raw: bytes | str, said: str = "the body is not JSON") -> Any:
    """JSON text parsed (orjson: no recursion, nesting refused past 1,024) without
    checking its values; BadRequest saying `said: why` where it is not JSON."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"{said}: {exc}") from None


def without_nul(value: Any) -> Any:
    """value with each NUL character in its strings and keys made U+FFFD (what a batch does
    to keep an item storable; value checked() first: its depth bounded)."""
    if isinstance(value, str):
        return value.replace(NUL, REPLACEMENT)
    if isinstance(value, list):
        return [without_nul(x) for x in value]
    if isinstance(value, dict):
        return {without_nul(k): without_nul(x) for k, x in value.items()}
    return value


def body(raw: bytes) -> Any:
    """A request's JSON body parsed and checked (checked()): the one way a route that
    takes JSON reads it."""
    got = loads(raw)
    checked(got)
    return got
