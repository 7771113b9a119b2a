"""The downstream remote write receiver (`recorder.remote_write.url`): a request goes on in
the version it came in, and its sender hears what the receiver said: 2xx only once the
receiver took it; the receiver's 429 as 429 and its 5xx, a timeout or no answer as 503,
so the sender retries (nothing is held here); its other 4xx as 400, which a sender does
not retry (counted rejected)."""

from __future__ import annotations

import base64
import os
import threading
from dataclasses import dataclass
from typing import TypedDict

import urllib3

from lens_ebpf.recorder.config import RemoteWriteConfig
from lens_ebpf.recorder.remote_write import wire

USER_AGENT = "lens-ebpf-recorder/0.1.0"


@dataclass(frozen=True)
class Answer:
    status: int  # what the sender hears
    downstream: int  # what the receiver said (0: no answer)
    message: str
    retry_after: str = ""
    written: dict[str, str] | None = None  # remote write 2.0's X-Prometheus-Remote-Write-*


class _Secret:
    """A credential file, read again when it changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[float, int] | None = None
        self.value = ""

    def read(self) -> str:
        if not self.path:
            return ""
        try:
            st = os.stat(self.path)
            if (st.st_mtime, st.st_size) != self._stamp:
                with open(self.path) as f:
                    self.value = f.read().strip()
                self._stamp = (st.st_mtime, st.st_size)
        except OSError:
            pass  # the last value stays
        return self.value


class _Tls(TypedDict, total=False):
    """The TLS keywords urllib3.PoolManager hands its HTTPS pools."""

    cert_reqs: str
    ca_certs: str | None
    cert_file: str | None
    key_file: str | None


class Forwarder:
    def __init__(self, cfg: RemoteWriteConfig) -> None:
        self.cfg = cfg
        tls = cfg.tls
        kw: _Tls = {}
        if cfg.url.startswith("https"):
            kw = {
                "cert_reqs": "CERT_NONE" if tls.insecure_skip_verify else "CERT_REQUIRED",
                "ca_certs": tls.ca_file or None,
                "cert_file": tls.cert_file or None,
                "key_file": tls.key_file or None,
            }
        self.pool = urllib3.PoolManager(
            num_pools=4,
            maxsize=16,
            retries=False,
            timeout=urllib3.Timeout(cfg.timeout_seconds),
            **kw,
        )
        self.bearer = _Secret(cfg.bearer_token_file)
        self.password = _Secret(cfg.basic_auth.password_file)
        self.errors: dict[str, int] = {}
        self.requests: dict[int, int] = {}
        self._lock = threading.Lock()

    def headers(self, version: int) -> dict[str, str]:
        h = {
            "Content-Encoding": "snappy",
            "Content-Type": wire.CONTENT_TYPES[version],
            "X-Prometheus-Remote-Write-Version": wire.VERSIONS[version],
            "User-Agent": USER_AGENT,
        }
        if token := self.bearer.read():
            h["Authorization"] = f"Bearer {token}"
        elif self.cfg.basic_auth.username:
            pair = f"{self.cfg.basic_auth.username}:{self.password.read()}".encode()
            h["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        return h

    def _count(self, reason: str) -> None:
        with self._lock:
            self.errors[reason] = self.errors.get(reason, 0) + 1

    def send(self, version: int, body: bytes) -> Answer:
        """body (uncompressed) to the receiver; what to tell the sender."""
        try:
            r = self.pool.request(
                "POST",
                self.cfg.url,
                body=wire.snappy(body),
                headers=self.headers(version),
                preload_content=True,
            )
        except urllib3.exceptions.HTTPError as exc:
            self._count("unreachable")
            return Answer(
                503,
                0,
                f"the receiver {self.cfg.url} did not answer: " f"{type(exc).__name__}: {exc}"[
                    :500
                ],
            )
        with self._lock:
            self.requests[r.status] = self.requests.get(r.status, 0) + 1
        said = r.data[:300].decode(errors="replace").strip()
        if 200 <= r.status < 300:
            written = {
                k: v
                for k, v in r.headers.items()
                if k.lower().startswith("x-prometheus-remote-write-")
            }
            return Answer(204, r.status, "OK", written=written or None)
        if r.status == 429:
            self._count("429")
            return Answer(
                429, 429, f"the receiver is throttling: {said}", r.headers.get("Retry-After", "")
            )
        if r.status >= 500:
            self._count("5xx")
            return Answer(503, r.status, f"the receiver answered {r.status}: {said}")
        self._count("4xx")
        return Answer(400, r.status, f"the receiver refused it ({r.status}): {said}")
