"""A thousand node agents' reporters streaming into the recorder at once: every
event written? how fast, and at what memory? One Report stream and connection per node
(tests/reportersim.py), the recorder with SQLite, or PostgreSQL with --postgres.

.venv/bin/python -m bench.reporters [--nodes 1000] [--events 20] [--postgres]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
from pathlib import Path

from sqlalchemy import create_engine, func, select

from bench import service
from lens_ebpf.recorder.store import schema
from tests.k8slab import FakeApiServer
from tests.reportersim import simulate


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m bench.reporters",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--events", type=int, default=20)
    ap.add_argument("--postgres", action="store_true")
    args = ap.parse_args()
    service.allow_streams(args.nodes)
    tmp = Path(tempfile.mkdtemp(prefix="lens-bench-reporters-"))
    url, pg = service.database(args.postgres, tmp, "reporters")
    api = FakeApiServer().start()
    app = service.start(url, tmp, api)
    try:
        got = simulate(f"127.0.0.1:{app.collect_port}", args.nodes, args.events)
        eng = create_engine(url)
        with eng.connect() as conn:
            stored = conn.execute(select(func.count()).select_from(schema.node_events)).scalar()
        eng.dispose()
        sent = args.nodes * args.events
        full = sum(1 for n in got.acked.values() if n == args.events)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"{args.nodes} reporters x {args.events} events into "
            f"{'PostgreSQL' if pg else 'SQLite'}: {stored} of {sent} written, "
            f"{full} of {args.nodes} streams acknowledged to their last event, in "
            f"{got.seconds:.1f} s ({sent / got.seconds:.0f} events/s); peak RSS of this "
            f"process (service and clients) {rss:.0f} MB"
        )
    finally:
        app.stop()
        api.kill()
        if pg:
            pg.destroy()


if __name__ == "__main__":
    main()
