"""The fuzz of issue 69 (tests/fuzzlab.py), longer than the suite's: every route of the
recorder's route tables with --examples generated requests each, --streams streams to
its collector port and --calls calls to the agent's gRPC port, on SQLite (or PostgreSQL
from tests/pglab.py with --postgres). What must hold after each input: no 5xx (no gRPC
INTERNAL, UNKNOWN or UNAVAILABLE), no traceback or error logged, no statement or driver text
in an answer, /readyz answering. Prints how many requests went out, by status, and each
finding (the example Hypothesis shrank it to); exits 1 when there is one.

.venv/bin/python -m bench.fuzz [--examples 100] [--streams 1000] [--calls 500] [--postgres]
    [--only PATH-SUBSTRING] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from tests import fuzzlab, pglab


def merge(into: dict[str, int], more: dict[str, int]) -> None:
    for k, v in more.items():
        into[k] = into.get(k, 0) + v


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    started = time.monotonic()
    pg = pglab.Postgres().init() if args.postgres else None
    url = pg.create_database("lens_fuzz") if pg else f"sqlite:///{tmp / 'recorder.db'}"
    out: dict[str, Any] = {
        "database": "postgresql" if pg else "sqlite",
        "routes": 0,
        "findings": [],
    }
    with fuzzlab.Logged() as logged:
        rec = fuzzlab.RecorderUnderFuzz(url, tmp, logged)
        try:
            for t in fuzzlab.targets():
                if args.only and args.only not in t.path:
                    continue
                out["routes"] += 1
                try:
                    rec.fuzz_route(t, args.examples)
                except AssertionError as exc:
                    out["findings"].append(f"{t}: {str(exc)[:2000]}")
                    rec.ready()  # a finding, not a service gone
            http_time = time.monotonic() - started
            streams = time.monotonic()
            if args.streams:
                try:
                    rec.fuzz_collector(args.streams)
                except AssertionError as exc:
                    out["findings"].append(f"collector port: {str(exc)[:2000]}")
            out["http"] = {
                "requests": rec.tally.sent
                - sum(v for k, v in rec.tally.by_status.items() if not k.isdigit()),
                "by_status": {k: v for k, v in sorted(rec.tally.by_status.items()) if k.isdigit()},
                "seconds": round(http_time, 1),
            }
            out["collector"] = {
                "streams": sum(v for k, v in rec.tally.by_status.items() if not k.isdigit()),
                "by_code": {
                    k: v for k, v in sorted(rec.tally.by_status.items()) if not k.isdigit()
                },
                "seconds": round(time.monotonic() - streams, 1),
            }
        finally:
            rec.close()
            if pg is not None:
                pg.destroy()
        if args.calls:
            calls = time.monotonic()
            agent = fuzzlab.AgentUnderFuzz(tmp, logged)
            try:
                agent.fuzz(args.calls)
            except AssertionError as exc:
                out["findings"].append(f"agent port: {str(exc)[:2000]}")
            finally:
                agent.close()
            out["agent"] = {
                "calls": agent.tally.sent,
                "by_code": dict(sorted(agent.tally.by_status.items())),
                "seconds": round(time.monotonic() - calls, 1),
            }
    out["seconds"] = round(time.monotonic() - started, 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fuzz")
    ap.add_argument("--examples", type=int, default=100, help="requests a route")
    ap.add_argument("--streams", type=int, default=1000, help="collector port streams")
    ap.add_argument("--calls", type=int, default=500, help="agent port calls")
    ap.add_argument("--postgres", action="store_true", help="PostgreSQL, not SQLite")
    ap.add_argument("--only", default="", help="the routes whose path holds this")
    ap.add_argument("--json", action="store_true", help="the figures as one JSON object")
    args = ap.parse_args()
    if args.postgres and pglab.unavailable():
        print(f"bench.fuzz: {pglab.unavailable()}", file=sys.stderr)
        return 2
    warnings.simplefilter("ignore")  # Hypothesis's about the services' threads' random module
    with tempfile.TemporaryDirectory(prefix="lens-fuzz-") as d:
        got = run(args, Path(d))
    if args.json:
        print(json.dumps(got))
    else:
        h, c = got["http"], got["collector"]
        print(
            f"{got['database']}: {got['routes']} routes, {h['requests']:,} requests in "
            f"{h['seconds']:.0f} s ({', '.join(f'{k}: {v}' for k, v in h['by_status'].items())})"
        )
        print(
            f"collector port: {c['streams']:,} streams in {c['seconds']:.0f} s "
            f"({', '.join(f'{k}: {v}' for k, v in c['by_code'].items())})"
        )
        if "agent" in got:
            a = got["agent"]
            print(
                f"agent port: {a['calls']:,} calls in {a['seconds']:.0f} s "
                f"({', '.join(f'{k}: {v}' for k, v in a['by_code'].items())})"
            )
        print(f"{len(got['findings'])} findings" if got["findings"] else "no finding")
        for f in got["findings"]:
            print(f"- {f}")
    return 1 if got["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
