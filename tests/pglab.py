"""A real PostgreSQL for tests: Debian's postgresql package, a throwaway cluster started
as the postgres user (initdb refuses root) on a free port, stopped and started again to
stand for a database outage."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from tests.conftest import hang_guard

WAIT = str(int(hang_guard(60)))  # pg_ctl -w: seconds to wait for the server (a hang guard)


def pg_bin() -> Path | None:
    """The newest installed server's bin directory."""
    root = Path("/usr/lib/postgresql")
    found = sorted(
        (p for p in root.glob("*/bin") if (p / "initdb").exists()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    return found[-1] if found else None


def unavailable() -> str:
    """Why a PostgreSQL cannot be started here; empty when it can."""
    if pg_bin() is None:
        return "Debian's postgresql is not installed (scripts/setup.sh test installs it)"
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        return "starting PostgreSQL as the postgres user needs root and runuser"
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Postgres:
    def __init__(self) -> None:
        bindir = pg_bin()
        assert bindir is not None
        self.bin = bindir
        self.base = Path(tempfile.mkdtemp(prefix="lens-pg-"))
        self.data = self.base / "data"
        self.port = _free_port()
        os.chmod(self.base, 0o755)
        shutil.chown(self.base, "postgres", "postgres")

    def _as_postgres(self, *args: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *args],
            check=True,
            cwd="/",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=hang_guard(90),
        )

    def init(self) -> Postgres:
        self._as_postgres(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
        )
        self.start()
        return self

    def start(self) -> None:
        opts = (
            f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c full_page_writes=off"
        )
        self._as_postgres(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            opts,
            "-w",
            "-t",
            WAIT,
            "-l",
            str(self.base / "log"),
            "start",
        )

    def stop(self) -> None:
        self._as_postgres(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-m",
            "immediate",
            "-w",
            "-t",
            WAIT,
            "stop",
        )

    def create_database(self, name: str, timezone: str = "") -> str:
        """A new empty database (its sessions in timezone, where one is given: a server
        set up in a local zone); its SQLAlchemy URL."""
        import psycopg

        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
            if timezone:  # the sessions' TimeZone: times come back in it
                conn.execute(f"ALTER DATABASE \"{name}\" SET timezone = '{timezone}'")
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self.stop()
        shutil.rmtree(self.base, ignore_errors=True)
