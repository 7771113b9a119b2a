"""The Kubernetes API client both services make (k8s/client.py): a kubeconfig's
insecure-skip-tls-verify said once, not by urllib3 on every request."""

from __future__ import annotations

import json
import logging
import ssl
import subprocess
import threading
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from lens_ebpf.k8s.client import api_client


class Namespaces(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = json.dumps(
            {"kind": "NamespaceList", "apiVersion": "v1", "metadata": {}, "items": []}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def https_api(tmp_path: Path) -> Iterator[str]:
    """An API stand-in over HTTPS with a self-signed certificate; its URL."""
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Namespaces)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_an_unverified_api_is_said_once_not_on_every_request(
    https_api: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from kubernetes import client

    config = tmp_path / "kubeconfig"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [
                    {
                        "name": "k",
                        "cluster": {"server": https_api, "insecure-skip-tls-verify": True},
                    }
                ],
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
            }
        )
    )
    with warnings.catch_warnings(record=True) as said, caplog.at_level(logging.WARNING):
        for _ in range(2):  # a second client of the same API says nothing more
            core = client.CoreV1Api(api_client("kubeconfig", str(config)))
            for _ in range(3):
                assert core.list_namespace().items == []
    assert [str(w.message) for w in said] == []
    lines = [r.getMessage() for r in caplog.records if r.name == "lens_ebpf.k8s.client"]
    assert lines == [
        f"kubernetes API {https_api}: its certificate is not verified " "(insecure-skip-tls-verify)"
    ]
