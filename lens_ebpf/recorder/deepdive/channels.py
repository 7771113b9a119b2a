"""The recorder's gRPC calls to the node agents (DeepDiveService and ProfilerService on
each agent's gRPC port): one channel per agent address, TLS when the agents' CA is named,
and the recorder's bearer token, read at each call (a projected token is rotated)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Protocol

from lens_ebpf.recorder.errors import Unavailable


class AgentSettings(Protocol):
    agent_port: int
    ca_file: str
    token_file: str


class AgentChannels:
    """Channels to the agents for one part of the recorder (`setting` names its section in
    errors, e.g. recorder.deepdive)."""

    def __init__(self, cfg: AgentSettings, setting: str) -> None:
        self.cfg, self.setting = cfg, setting
        self._channels: dict[str, Any] = {}
        self._lock = threading.Lock()

    def channel(self, address: str) -> Any:
        import grpc

        with self._lock:
            ch = self._channels.get(address)
            if ch is None:
                target = f"{address}:{self.cfg.agent_port}"
                if self.cfg.ca_file:
                    creds = grpc.ssl_channel_credentials(Path(self.cfg.ca_file).read_bytes())
                    ch = grpc.secure_channel(target, creds)
                else:
                    ch = grpc.insecure_channel(target)
                self._channels[address] = ch
        return ch

    def metadata(self) -> tuple[tuple[str, str], ...]:
        if not self.cfg.token_file:
            return ()
        try:
            token = Path(self.cfg.token_file).read_text().strip()
        except OSError as exc:
            raise Unavailable(f"{self.setting}.token_file: {exc}") from None
        return (("authorization", f"Bearer {token}"),)

    def close(self) -> None:
        with self._lock:
            for ch in self._channels.values():
                ch.close()
            self._channels.clear()
