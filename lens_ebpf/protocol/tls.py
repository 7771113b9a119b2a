"""TLS for the gRPC services both sides speak: a server's credentials (the agent's
Subscribe port, the recorder's collector port) and a client's (the reporter)."""

from __future__ import annotations

from pathlib import Path

import grpc

from lens_ebpf.core.settings import Section


class ServerTlsConfig(Section):
    cert: str = ""
    key: str = ""
    client_ca: str = ""  # set: clients must present a certificate it signed (mTLS)


class ClientTlsConfig(Section):
    ca: str = ""
    cert: str = ""
    key: str = ""


def server_credentials(cert: str, key: str, client_ca: str) -> grpc.ServerCredentials | None:
    """TLS when cert and key are set; mutual TLS when a client CA is set too."""
    if not cert:
        return None
    pair = [(Path(key).read_bytes(), Path(cert).read_bytes())]
    if client_ca:
        return grpc.ssl_server_credentials(pair, Path(client_ca).read_bytes(), True)
    return grpc.ssl_server_credentials(pair)


def channel_credentials(ca: str, cert: str, key: str) -> grpc.ChannelCredentials | None:
    if not ca:
        return None
    return grpc.ssl_channel_credentials(
        Path(ca).read_bytes(),
        Path(key).read_bytes() if key else None,
        Path(cert).read_bytes() if cert else None,
    )
