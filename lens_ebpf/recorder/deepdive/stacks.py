"""Each rank's stack at a stall or a hang, compared: py-spy dump's main thread read
(main_stack), stacks that agree but for line numbers (signature), the ranks side by side
with those whose stack differs from most (compare), and what one capture waits on
(Capture)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass
class Capture:
    """One stall's stacks: what asked first, when, the alerts still to be given them."""

    workload_uid: str
    why: str
    started: datetime
    alerts: list[str]
    stall_at: datetime | None = None
    summary: dict[str, Any] | None = None
    kept: bool = False


def main_stack(dump: bytes) -> list[str]:
    """py-spy dump's JSON: the main thread's frames (the first thread; MainThread where
    named), innermost first, as 'function (file:line)'."""
    try:
        threads = json.loads(dump)
    except ValueError:
        return []
    if not isinstance(threads, list) or not threads:
        return []
    main = next((t for t in threads if t.get("thread_name") == "MainThread"), threads[0])
    return [
        f"{f.get('name')} ({f.get('short_filename') or f.get('filename')}:{f.get('line')})"
        for f in main.get("frames") or []
    ]


def signature(stack: list[str]) -> tuple[str, ...]:
    """A stack without line numbers (ranks at another line of the same function agree)."""
    return tuple(f.rsplit(":", 1)[0] for f in stack)


def compare(ranks: list[dict[str, Any]], why: str, at: str) -> dict[str, Any]:
    """The ranks side by side, and those whose stack differs from the others: the
    stack most ranks share, where there is a tie the first rank's (by pod name)."""
    got = [r for r in ranks if r["stack"]]
    counts: dict[tuple[str, ...], int] = {}
    for r in got:
        counts[signature(r["stack"])] = counts.get(signature(r["stack"]), 0) + 1
    common: tuple[str, ...] | None = None
    if got:
        most = max(counts.values())
        common = next(signature(r["stack"]) for r in got if counts[signature(r["stack"])] == most)
    for r in ranks:
        r.pop("_pod", None)
        r["differs"] = bool(r["stack"]) and signature(r["stack"]) != common
    return {
        "reason": why,
        "captured_at": at,
        "ranks": ranks,
        "different": [r["pod"] for r in ranks if r["differs"]],
        "unread": [r["pod"] for r in ranks if not r["stack"]],
    }
