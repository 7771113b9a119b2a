"""Helpers for gRPC tests: certificates from openssl, a host exec generator."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SPAWN = """
import os, sys, time
n, pause = int(sys.argv[1]), float(sys.argv[2])
for _ in range(n):
    os.waitpid(os.posix_spawn("/bin/true", ["/bin/true"], {}), 0)
    time.sleep(pause)
"""


def spawn_execs(n: int, pause: float = 0.0) -> subprocess.Popen:
    """A process that execs /bin/true n times (events on the host)."""
    return subprocess.Popen([sys.executable, "-c", SPAWN, str(n), str(pause)])


def make_certs(d: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=lens-test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    )
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        run(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN=lens-{name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
        )
        (d / f"{name}.ext").write_text(ext + "\n")
        run(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            f"{name}.crt",
            "-extfile",
            f"{name}.ext",
        )
    return {k: d / k for k in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}
