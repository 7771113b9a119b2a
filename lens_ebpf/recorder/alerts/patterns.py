"""The regular expressions clients give (log rules and their test, log rules' label
selectors, silences' matchers) compiled with RE2 (google-re2), as Prometheus,
Alertmanager and Loki compile theirs: matching is linear in the text, so no pattern can
hold a worker (Python's re took 6 s on `(a+)+$` against 27 `a`s and a `!`, twice that
for each `a` more). RE2 refuses what it cannot match in linear time (backreferences,
look-around, possessive repeats) and a few spellings of Python's own (`\\Z`, `(?P=name)`,
a repeat over 1,000): BadRequest naming the field and RE2's reason.

Beside Python's re: `\\w`, `\\d` and `\\b` are ASCII, `$` is the end of the text (not
before a last newline) unless multi-line."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import re2

from lens_ebpf.recorder.errors import BadRequest

MAX_MEM = 8 << 20  # RE2's default: a pattern whose program needs more is refused


def _options(ignore_case: bool) -> Any:
    o = re2.Options()
    o.log_errors = False  # a refused pattern is the client's 400, not a line on stderr
    o.max_mem = MAX_MEM
    o.case_sensitive = not ignore_case
    return o


def _reason(exc: Exception) -> str:
    said = exc.args[0] if exc.args else exc
    return said.decode(errors="replace") if isinstance(said, bytes) else str(said)


@lru_cache(maxsize=1024)
def _compiled(pattern: str, ignore_case: bool, multi_line: bool) -> tuple[Any, str]:
    """(the compiled pattern, "") or (None, RE2's reason for refusing it)."""
    try:
        return re2.compile(("(?m)" if multi_line else "") + pattern, _options(ignore_case)), ""
    except re2.error as exc:
        return None, _reason(exc)


def compile(pattern: str, field: str, ignore_case: bool = False, multi_line: bool = False) -> Any:
    """pattern compiled (search, fullmatch, match as re's); BadRequest naming field where
    RE2 refuses it."""
    got, why = _compiled(pattern, ignore_case, multi_line)
    if got is None:
        raise BadRequest(
            f"{field}={pattern!r}: {why} (RE2 syntax: no backreferences or " "look-around)"
        )
    return got


def check(pattern: str, field: str) -> None:
    """BadRequest naming field where RE2 refuses pattern."""
    compile(pattern, field)


def full(pattern: str, value: str) -> bool:
    """Whether pattern matches the whole of value (Prometheus's and Alertmanager's regex
    matchers are anchored); a pattern RE2 refuses matches nothing."""
    got, _ = _compiled(pattern, False, False)
    return got is not None and got.fullmatch(value) is not None
