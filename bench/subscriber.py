"""A Subscribe client for the bench: counts the events it receives until SIGTERM, then
prints `events=N flows=M` (flows: flow_closed events to the given remote address).

    python -m bench.subscriber HOST:PORT RADDR [KIND...]
"""

from __future__ import annotations

import signal
import sys
import threading

import grpc

from lens_ebpf.api.gen import lens_pb2 as pb
from lens_ebpf.api.gen import lens_pb2_grpc


def main(addr: str, raddr: str, kinds: list[str]) -> int:
    stub = lens_pb2_grpc.EventServiceStub(grpc.insecure_channel(addr))
    stream = stub.Subscribe(pb.SubscribeRequest(kinds=kinds))
    done = threading.Event()

    def stop(*_: object) -> None:
        done.set()
        stream.cancel()

    signal.signal(signal.SIGTERM, stop)
    events = flows = 0
    print("subscribed", flush=True)
    try:
        for ev in stream:
            events += 1
            if ev.WhichOneof("payload") == "flow_closed" and ev.flow_closed.raddr == raddr:
                flows += 1
    except grpc.RpcError:
        if not done.is_set():
            raise
    print(f"events={events} flows={flows}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
